"""意象 (imagery): a lexicon of classic image words, found in poems and ranked by distinctiveness.

The lexicon holds 121 entries in eight themes (天光 sky and light, 风雨 weather, 草木 plants,
禽虫 birds and insects, 山水 landscape, 离别 parting, 器物 objects, 心绪 feelings). An entry is
written `"杨柳|楊柳"`: its simplified spelling, which names it, then every other spelling it is
matched by. The corpus mixes scripts (全唐诗 and 全宋诗 are traditional, 全宋词 and 元曲
simplified) and old texts use variant characters (鴈 for 雁, 盃 for 杯), so a traditional poem
finds 楊柳 under the entry 杨柳. A fact about a poem states the spelling found in it, so it is
literally a substring of the poem.

Matching is one left-to-right scan that takes, at each position, the longest spelling that
starts there, and then continues after it: in 举头望明月 the scan finds 明月 and not also the
月 inside it. A 月 elsewhere in the same poem is an occurrence of its own. The scan knows no
word boundaries: the 酒 of the place name 酒泉 counts as 酒, which stays a true statement about
the text, if not always an image. Single characters
(月, 柳, 酒) are in the lexicon because they are images on their own, but they are common: in
the 398k-poem corpus 月 is in 15.5% of the poems, 江 in 11.8%, 酒 in 10.0%, 孤舟 in 0.3%.

Distinctiveness is TF-IDF over the corpus the stage runs on: an entry found `c` times in a
poem scores `c * log((N + 1) / (df + 1))`, N being the number of poems and df the number that
contain the entry. A poem's images are ranked by score, then longer words first, then by code
point, so ties never depend on dictionary order or on the worker that computed them.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

THEMES: dict[str, tuple[str, ...]] = {
    "天光": ("明月", "月", "残月|殘月", "新月", "月光", "夕阳|夕陽", "斜阳|斜陽", "落日", "黄昏|黃昏",
             "白云|白雲", "浮云|浮雲", "孤云|孤雲", "星河", "银河|銀河", "晚霞"),
    "风雨": ("春风|春風", "东风|東風", "西风|西風", "秋风|秋風", "朔风|朔風", "春雨", "秋雨", "细雨|細雨",
             "烟|煙", "露", "霜", "雪", "冰", "雷"),
    "草木": ("杨柳|楊柳", "柳", "垂杨|垂楊", "梅花", "梅", "菊花", "菊", "兰|蘭", "竹", "松", "桃花",
             "杏花", "落花", "芳草", "梧桐", "芭蕉", "荷", "莲|蓮", "红豆|紅豆", "桂", "苔", "飞蓬|飛蓬",
             "芦花|蘆花", "枫|楓", "红叶|紅葉", "牡丹", "海棠"),
    "禽虫": ("雁|鴈", "归雁|歸雁|歸鴈", "鸿|鴻", "鹤|鶴", "杜鹃|杜鵑", "子规|子規", "鹧鸪|鷓鴣",
             "黄鹂|黃鸝", "燕", "蝉|蟬", "寒蝉|寒蟬", "蟋蟀", "蝴蝶", "鸳鸯|鴛鴦", "猿", "寒鸦|寒鴉",
             "莺|鶯|鸎", "鸥|鷗", "鱼|魚"),
    "山水": ("长江|長江", "江", "青山", "流水", "孤舟", "扁舟", "帆", "渡口", "天涯", "孤城", "关山|關山",
             "落木", "沧海|滄海", "瀑布"),
    "离别": ("南浦", "长亭|長亭", "阳关|陽關", "灞桥|灞橋", "故乡|故鄉", "故园|故園", "家书|家書",
             "征人", "归舟|歸舟"),
    "器物": ("酒", "杯|盃", "笛", "羌笛", "砧", "捣衣|搗衣|擣衣", "琴", "琵琶", "钟|鐘|鍾", "灯|燈",
             "烛|燭", "剑|劍|劒", "镜|鏡", "高楼|高樓", "楼|樓", "栏杆|欄杆|闌干|阑干", "秋千|鞦韆"),
    "心绪": ("泪|淚", "梦|夢", "白发|白髮", "相思", "乡愁|鄉愁", "断肠|斷腸"),
}


@dataclass(frozen=True)
class Imagery:
    """One lexicon entry: its simplified `word`, its theme, and every spelling it is matched by."""

    word: str
    theme: str
    spellings: tuple[str, ...]


LEXICON: tuple[Imagery, ...] = tuple(Imagery(written.split("|")[0], theme, tuple(written.split("|")))
                                     for theme, words in THEMES.items() for written in words)
_ENTRY_OF_SPELLING: dict[str, str] = {s: e.word for e in LEXICON for s in e.spellings}
# Longest spelling first: at each position the regex engine takes the first alternative that
# matches, which is then the longest one (leftmost-longest).
_PATTERN = re.compile("|".join(sorted(_ENTRY_OF_SPELLING, key=lambda s: (-len(s), s))))


def lexicon_fingerprint() -> str:
    """sha256 of the lexicon's spellings: what a saved document-frequency table was counted with."""
    text = "\n".join(f"{e.word}:{'|'.join(e.spellings)}" for e in LEXICON)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Found:
    """An entry found in one poem: how often, and the spelling of its first occurrence."""

    word: str
    count: int
    spelling: str


def find_imagery(text: str) -> dict[str, Found]:
    """The lexicon entries in `text`, keyed by entry word, in order of first occurrence."""
    counts: Counter = Counter()
    first: dict[str, str] = {}
    for match in _PATTERN.finditer(text):
        word = _ENTRY_OF_SPELLING[match.group()]
        counts[word] += 1
        first.setdefault(word, match.group())
    return {w: Found(w, counts[w], s) for w, s in first.items()}


@dataclass
class ImageryStats:
    """Document frequency of every lexicon entry over a corpus of `documents` poems."""

    documents: int = 0
    doc_freq: Counter = field(default_factory=Counter)

    def add_text(self, text: str) -> None:
        self.documents += 1
        self.doc_freq.update(find_imagery(text).keys())

    def merge(self, other: "ImageryStats") -> "ImageryStats":
        return ImageryStats(self.documents + other.documents, self.doc_freq + other.doc_freq)

    def idf(self, word: str) -> float:
        return math.log((self.documents + 1) / (self.doc_freq.get(word, 0) + 1))

    def to_json(self) -> dict:
        return {"lexicon": lexicon_fingerprint(), "documents": self.documents,
                "doc_freq": {e.word: self.doc_freq.get(e.word, 0) for e in LEXICON}}

    @classmethod
    def from_json(cls, data: dict) -> "ImageryStats":
        return cls(int(data["documents"]), Counter({w: int(n) for w, n in data["doc_freq"].items() if n}))


def count_imagery(texts: Iterable[str]) -> ImageryStats:
    stats = ImageryStats()
    for text in texts:
        stats.add_text(text)
    return stats


def distinctive_imagery(text: str, stats: ImageryStats, limit: int = 3) -> list[str]:
    """Up to `limit` images of `text`, most distinctive first, as spelled in the text.

    An entry is skipped when its word contains, or is contained in, one already chosen (明月
    and 月 found in separate places would otherwise both be named).
    """
    ranked = sorted(find_imagery(text).values(),
                    key=lambda f: (-f.count * stats.idf(f.word), -len(f.word), f.word))
    chosen: list[Found] = []
    for found in ranked:
        if len(chosen) == limit:
            break
        if not any(found.word in c.word or c.word in found.word for c in chosen):
            chosen.append(found)
    return [f.spelling for f in chosen]
