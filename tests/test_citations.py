"""Papers are cited by title and arXiv number: one paper has one number and
one number one paper across the code and the docs, and numbers that were
once wrong are right."""

import collections
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
# "Title", arXiv 1234.56789 / *Title*, [arXiv 1234.56789](...), across line
# breaks and comment marks.
_CITED = re.compile(r'["*“]([A-Z][^"*”]{8,200}?)[,.]?["*”][,.]?\s*\(?\[?'
                    r'arXiv[: ]\s*(\d{4}\.\d{4,5})', re.S)
# Checked against arxiv.org: numbers the repository once got wrong.
KNOWN = {"powersgd: practical low-rank gradient compression for "
         "distributed optimization": "1905.13727"}


def _citations() -> list[tuple[str, str, str]]:
  out = []
  for folder in ("lowbw", "docs", "experiments", "benchmarks", "examples"):
    for path in sorted((ROOT / folder).rglob("*")):
      if path.suffix not in (".py", ".md"):
        continue
      text = path.read_text(encoding="utf-8")
      for m in _CITED.finditer(text):
        title = " ".join(re.sub(r"\s*#\s*", " ", m.group(1)).split())
        out.append((title.rstrip(",.").lower(), m.group(2),
                    str(path.relative_to(ROOT))))
  return out


def test_each_paper_has_one_arxiv_number_and_each_number_one_paper():
  cites = _citations()
  assert len(cites) >= 20  # the pattern finds the repository's citations
  numbers, titles = collections.defaultdict(set), collections.defaultdict(set)
  for title, number, where in cites:
    numbers[title].add((number, where))
    titles[number].add(title)
  for title, found in numbers.items():
    assert len({n for n, _ in found}) == 1, (title, sorted(found))
  for number, found in titles.items():
    assert len(found) == 1, (number, sorted(found))


def test_known_papers_carry_their_arxiv_numbers():
  cites = _citations()
  for title, number in KNOWN.items():
    found = {(n, where) for t, n, where in cites if t == title}
    assert found, f"{title!r} is cited nowhere"
    assert {n for n, _ in found} == {number}, sorted(found)
