"""Streams through kvroute to a real engine (vLLM or SGLang) with the official `openai` SDK.

Usage: sdk_stream_check.py BASE_URL MODEL PROMPT
Prints one line per check and `sdk checks: all ok` at the end; exits non-zero on a failure.
The same prompt is streamed twice, so the second usage chunk must report cached tokens.
"""

import sys

import openai


def main() -> int:
    base, model, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)

    def check(name, cond, detail=""):
        if not cond:
            print(f"FAIL {name}: {detail}")
            raise SystemExit(1)
        print(f"ok   {name}")

    def chat_stream(max_tokens, **options):
        return client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
            extra_body={"ignore_eos": True},
            **options,
        )

    check("models.list names the model", any(m.id == model for m in client.models.list().data))

    for attempt in ("cold", "warm"):
        stream = chat_stream(6, stream_options={"include_usage": True})
        pieces, usage, finish, after_usage = [], None, None, 0
        for chunk in stream:
            if usage is not None:
                after_usage += 1
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta.content:
                    pieces.append(c.delta.content)
                if c.finish_reason:
                    finish = c.finish_reason
        check(f"chat stream ({attempt}) delivers content", len(pieces) > 0, pieces)
        check(f"chat stream ({attempt}) ends with a finish reason", finish == "length", finish)
        check(f"chat stream ({attempt}) ends with the usage chunk", usage is not None and after_usage == 0, usage)
        check(f"chat usage ({attempt}) counts the tokens", usage.completion_tokens == 6 and usage.prompt_tokens > 0, usage)
        cached = (usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0
        if attempt == "warm":
            check("the warm stream's usage reports cached tokens", cached > 0, usage)

    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    texts, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        texts.extend(c.text for c in chunk.choices if c.text)
    check("completion stream delivers text", len(texts) > 0, texts)
    check("completion stream reports usage", usage is not None and usage.completion_tokens == 5, usage)

    # Without include_usage, as most clients stream, the router counts an answer's tokens by its
    # stream's events (crates/kvroute-router/src/proxy/stream_events.rs): one per decode step,
    # plus chat's role-only first event and a finish-only last one where the engine sends it,
    # fewer where the engine holds a token back whose text ends inside a character (SGLang's
    # detokenizer sends it with the next one; the tiny test model writes byte-level tokens, and
    # SGLang 0.5.23 sent 10 to 14 events for 12 of them). Half the tokens is the floor.
    for api in ("chat", "completion"):
        if api == "chat":
            stream = chat_stream(12)
        else:
            stream = client.completions.create(
                model=model, prompt=prompt, max_tokens=12, stream=True, extra_body={"ignore_eos": True}
            )
        events, usage = 0, None
        for chunk in stream:
            events += 1
            if chunk.usage is not None:
                usage = chunk.usage
        if usage is None:
            check(f"{api} stream without usage: {events} events for 12 tokens", 6 <= events <= 14, events)
        else:
            check(f"{api} stream's unasked usage counts the tokens", usage.completion_tokens == 12, usage)

    raw = client.completions.with_raw_response.create(model=model, prompt="Hello", max_tokens=2)
    check("x-kvroute-worker header present", bool(raw.headers.get("x-kvroute-worker")), raw.headers)
    print("sdk checks: all ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
