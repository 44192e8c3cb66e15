"""Drives a kvroute router with the official `openai` Python SDK.

Usage: python3 openai_sdk_check.py BASE_URL MODEL
Exits non-zero on the first failed check; prints one line per check.
"""

import sys

import openai


def main() -> int:
    base, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)
    passed = 0

    def check(name, cond, detail=""):
        nonlocal passed
        if not cond:
            print(f"FAIL {name}: {detail}")
            raise SystemExit(1)
        passed += 1
        print(f"ok   {name}")

    models = client.models.list()
    check("models.list names the model", any(m.id == model for m in models.data), models)

    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}],
        max_tokens=8,
    )
    check("chat completion has content", bool(chat.choices[0].message.content), chat)
    check("chat usage counted", chat.usage is not None and chat.usage.completion_tokens == 8, chat.usage)

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to five"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("chat stream delivers one chunk per token", len(pieces) == 6, pieces)
    check("chat stream ends with a finish reason", finish is not None, finish)
    check("chat stream reports usage", usage is not None and usage.completion_tokens == 6, usage)

    comp = client.completions.create(model=model, prompt="Once upon a time", max_tokens=5)
    check("completion has text", bool(comp.choices[0].text), comp)

    raw = client.completions.with_raw_response.create(model=model, prompt="Hello", max_tokens=2)
    check("x-kvroute-worker header present", bool(raw.headers.get("x-kvroute-worker")), raw.headers)

    texts = [c.choices[0].text for c in client.completions.create(model=model, prompt="Tell me", max_tokens=4, stream=True) if c.choices]
    check("completion stream delivers tokens", len([t for t in texts if t]) == 4, texts)

    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        check("unknown model raises NotFoundError", False, "no error")
    except openai.NotFoundError as e:
        check("unknown model raises NotFoundError", e.status_code == 404, e)

    try:
        client.chat.completions.create(model=model, messages=[], max_tokens=1)
        check("empty messages raises BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        check("empty messages raises BadRequestError", e.status_code == 400, e)

    print(f"{passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
