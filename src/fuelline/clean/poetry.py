"""The poetry profile: chinese-poetry records into clean document records with metadata.

A raw record has `title`, `author`, `paragraphs`, `source`, `dynasty` (see the corpus README).
In order, a poem is: checked for shape (malformed records are dropped with the reason), built
into text (one line per `paragraphs` entry), stripped of editorial notes, checked for dirt
(missing-character marks, placeholders, private-use characters), checked against the rules of
its form, and given normalized metadata (title without its part number, normalized author,
form inferred from the collection).

Form rules count Han characters per *clause*, the span between punctuation marks, because a
`paragraphs` entry usually holds a whole couplet. Regulated shi has clauses of 4 to 8
characters (五言 and 七言 with some 四言 and 六言); ci and qu are sung to tunes whose lines
run from 1 to 11 characters, and qu adds padding words (衬字) that make clauses longer still, so
each form gets its own bounds instead of the shi rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fuelline.records import Drop
from fuelline.text import HAN, PRIVATE_USE, han_count, normalize_text

FORM_BY_SOURCE = {
    **dict.fromkeys(["quantangshi", "quansongshi", "yuding_quantangshi", "tangshi_300", "tangshi_bulu",
                     "shuimo_tangshi", "qianjiashi", "mengxue_tangshi_300", "quantangshi_error",
                     "quansongshi_error"], "shi"),
    **dict.fromkeys(["quansongci", "songci_300", "huajianji", "nantang_erzhu", "nalanxingde"], "ci"),
    "yuanqu": "qu",
}
# The corpus's dynasty keys (`meta.dynasty`) and the names a poem is presented with (packing, chat).
DYNASTY_NAMES = {"tang": "唐", "song": "宋", "yuan": "元", "wudai": "五代", "qing": "清", "han": "汉",
                 "zhanguo": "战国", "zhou": "周", "ming": "明"}
UNKNOWN_AUTHOR = "佚名"
UNKNOWN_AUTHOR_FORMS = {"不詳", "不详", "佚名", "無名氏", "无名氏", "失名", "闕名", "阙名", "無名", "无名"}

NUMERAL = "一二三四五六七八九十百"
# "其一" … "其一百二十" at the end of a title, or a bare trailing numeral after a space.
PART_SUFFIX = re.compile(rf"\s*(?:其([{NUMERAL}]+)|\s([{NUMERAL}]+))$")
DYNASTY_PREFIX = re.compile(r"^[（(]\s*[^）)]{1,4}\s*[）)]\s*")
# Editorial notes inside poem text: bracketed variants and remarks, footnote marks and lines.
NOTE_PATTERNS = (
    re.compile(r"（[^（）]{0,400}）"),
    re.compile(r"\([^()]{0,400}\)"),
    re.compile(r"^〖[^〗\n]{0,6}〗.*$", re.MULTILINE),  # a footnote line
    re.compile(r"〖[^〗\n]{0,6}〗"),
    re.compile(r"\[\d{1,3}\]"),
)
CLAUSE_SPLIT = re.compile(r"[，。？！；、：,.?!;:\n]+")
COMPOSED = re.compile(r"\{[^{}]{1,20}\}")
LATIN_OR_DIGIT = re.compile(r"[A-Za-z0-9]")


@dataclass(frozen=True)
class FormRule:
    min_clause: int
    max_clause: int
    min_clauses: int


FORM_RULES = {
    "shi": FormRule(min_clause=4, max_clause=8, min_clauses=2),
    "ci": FormRule(min_clause=1, max_clause=12, min_clauses=2),
    "qu": FormRule(min_clause=1, max_clause=24, min_clauses=2),
    "other": FormRule(min_clause=1, max_clause=16, min_clauses=2),
}


def chinese_numeral(text: str) -> int | None:
    """Value of a numeral of 一 … 九百九十九, e.g. 十二 → 12, 二十 → 20, 一百零五 is not handled."""
    digits = {c: i for i, c in enumerate("零一二三四五六七八九")}
    total, current = 0, 0
    for char in text:
        if char in digits:
            current = digits[char]
        elif char in "十百":
            total += (current or 1) * (10 if char == "十" else 100)
            current = 0
        else:
            return None
    return total + current


def split_title(title: str) -> tuple[str, int | None]:
    """('帝京篇十首', 1) from '帝京篇十首 一'; ('菩萨蛮', 2) from '菩萨蛮 其二'."""
    match = PART_SUFFIX.search(title)
    if not match:
        return title, None
    part = chinese_numeral(match.group(1) or match.group(2))
    if not part:
        return title, None
    return title[: match.start()].strip(), part  # a title that was only "其二" becomes ""


def normalize_author(author: str | None) -> str:
    """'（唐）孟浩然' → '孟浩然'; 不詳 / 佚名 / 无名氏 / missing → one unknown author."""
    if not author:
        return UNKNOWN_AUTHOR
    author = DYNASTY_PREFIX.sub("", normalize_text(author, form=None))
    return UNKNOWN_AUTHOR if author in UNKNOWN_AUTHOR_FORMS or not author else author


def strip_notes(text: str) -> tuple[str, int]:
    removed = 0
    for pattern in NOTE_PATTERNS:
        text, n = pattern.subn("", text)
        removed += n
    return text, removed


def dirt_reason(text: str) -> str | None:
    if "□" in text:
        return "missing_character"
    if "○" in text or "〇" in text:
        return "placeholder_circle"
    if COMPOSED.search(text):
        return "composed_character"
    if PRIVATE_USE.search(text):
        return "private_use_character"
    if LATIN_OR_DIGIT.search(text):
        return "latin_or_digits"
    return None


def form_reason(text: str, form: str) -> str | None:
    rule = FORM_RULES[form]
    lengths = [n for n in (han_count(c) for c in CLAUSE_SPLIT.split(text)) if n]
    if len(lengths) < rule.min_clauses:
        return f"{form}_too_few_clauses"
    if min(lengths) < rule.min_clause or max(lengths) > rule.max_clause:
        return f"{form}_clause_length"
    return None


def malformed_reason(record: dict) -> str | None:
    paragraphs = record.get("paragraphs")
    if paragraphs is None:
        return "missing 'paragraphs'"
    if not isinstance(paragraphs, list) or not all(isinstance(p, str) for p in paragraphs):
        return "'paragraphs' must be a list of strings"
    for key in ("title", "author", "source", "dynasty"):
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key!r} must be a string, found {type(record[key]).__name__}"
    return None


def clean_poem(record: dict, *, max_han: int = 3000) -> tuple[dict | Drop, int]:
    """(document record or Drop, number of notes removed) for one raw poetry record."""
    problem = malformed_reason(record)
    if problem:
        return Drop("malformed_record", problem), 0
    text, notes = strip_notes("\n".join(normalize_text(p, form=None) for p in record["paragraphs"]))
    reason = dirt_reason(text)
    # Lines left with no Han character (a lone "。" after its note was removed) are not verse.
    text = "\n".join(line for line in normalize_text(text, form=None).split("\n") if HAN.search(line))
    if not text:
        return Drop("empty_poem"), notes
    source = record.get("source") or ""
    form = FORM_BY_SOURCE.get(source, "other")
    if reason is None:
        reason = "too_long" if han_count(text) > max_han else form_reason(text, form)
    if reason:
        return Drop(reason), notes
    title, part = split_title(normalize_text(strip_notes(record.get("title") or "")[0], form=None))
    meta = {
        "title": "" if "□" in title else title,
        "author": UNKNOWN_AUTHOR if "□" in (record.get("author") or "") else normalize_author(record.get("author")),
        "dynasty": record.get("dynasty"),
        "source": source,
        "form": form,
    }
    if part is not None:
        meta["part"] = part
    upstream = record.get("id")
    doc_id = f"{source}/{upstream}" if upstream else None
    return {"id": doc_id, "text": text, "meta": meta}, notes
