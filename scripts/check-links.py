#!/usr/bin/env python3
"""Checks every relative link and anchor in README.md and docs/ (run by .ci/run).

A link to a file must name one that exists (relative to the page, as GitHub and mdBook read
it); a link with `#anchor` must name a heading of the target page (GitHub's and mdBook's
heading ids: lower case, punctuation dropped, spaces as `-`, repeats suffixed `-1`, `-2`) or an
`<a id=…>`/`<a name=…>` in it. Links in fenced code and inline code are not links. External
links (`https:`, `mailto:`) are not fetched: CI has no network. Also checks that every page
directly under docs/ is in docs/SUMMARY.md, so none is left out of the site.

Why not mdbook-linkcheck: it checks the pages mdBook renders, and README.md (the front page on
GitHub) is outside the book; this checker covers both, with nothing more to build or cache.

    python3 scripts/check-links.py          # exit 1 and a list of broken links
"""

import pathlib
import re
import sys
import unicodedata

ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+[^>]*(?:id|name)=\"([^\"]+)\"")


def pages() -> list:
    docs = [
        p
        for p in sorted((ROOT / "docs").rglob("*.md"))
        if "book" not in p.relative_to(ROOT / "docs").parts[:1]
    ]
    return [ROOT / "README.md"] + docs


def slug(heading: str) -> str:
    """GitHub's (and mdBook's) id of a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's label
    text = text.replace("`", "").strip().lower()
    out = []
    for ch in text:
        if ch in "-_" or unicodedata.category(ch)[0] in "LN":
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)


def prose(path: pathlib.Path):
    """(line number, line) outside fenced code, inline code removed."""
    fenced = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fenced is None:
                fenced = m.group(1)
            elif m.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            yield n, INLINE_CODE.sub("", line)


def anchors(path: pathlib.Path, cache: dict) -> set:
    if path not in cache:
        ids, seen = set(), {}
        for _, line in prose(path):
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                ids.add(base if k == 0 else f"{base}-{k}")
            ids.update(HTML_ID.findall(line))
        cache[path] = ids
    return cache[path]


def links(page: pathlib.Path):
    """(line number, target) of every link, a label broken over lines included."""
    numbered = list(prose(page))
    text = "\n".join(line for _, line in numbered)
    for m in LINK.finditer(text):
        yield numbered[text.count("\n", 0, m.start())][0], m.group(1)
    for n, line in numbered:
        m = REFERENCE.match(line)
        if m:
            yield n, m.group(1)


def broken_links(page: pathlib.Path, cache: dict) -> list:
    found = []
    for n, target in links(page):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # https:, mailto:, ...
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(ROOT)}:{n}: {target}"
        if not dest.exists():
            found.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest, cache):
            found.append(f"{where}: no heading `#{anchor}` in {dest.relative_to(ROOT)}")
    return found


def left_out_of_summary() -> list:
    summary = (ROOT / "docs" / "SUMMARY.md").read_text()
    listed = set(re.findall(r"\]\(([^)#]+)", summary))
    return [
        f"docs/{p.name}: not in docs/SUMMARY.md (not on the site)"
        for p in sorted((ROOT / "docs").glob("*.md"))
        if p.name != "SUMMARY.md" and p.name not in listed
    ]


def main() -> int:
    cache = {}
    checked = pages()
    problems = [b for p in checked for b in broken_links(p, cache)] + left_out_of_summary()
    for p in problems:
        print(p)
    print(f"{len(checked)} pages, {len(problems)} broken links", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
