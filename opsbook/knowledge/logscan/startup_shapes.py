"""A startup's shape, and a crash loop's next startup told to repeat the last one.

A server that crash-loops appends one startup to its log again and again, each differing from
the last only in its times and PIDs. Such startups share a shape (:func:`shape_of`): their lines
with each time and PID replaced by its order of first appearance, and the gaps between their
line numbers. The diagnosis reads times and PIDs only as equal or not (which lines belong to one
record), so startups of one shape get one verdict.

A :class:`Template` is a closed startup with the line that began the next one. A later startup
whose lines, with that next first line, repeat it (:meth:`Template.repeats`: the same text once
the digits are masked, the same text outside times and PIDs, and times and PIDs that map one to
one) is read by the splitter exactly as the template was: the same lines begin and end it, and it
has the template's shape. Telling that takes a few passes over the startup's text in C instead
of the splitter's tests of every line and the shape's regular expression.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cached_property
from itertools import chain, repeat
from operator import itemgetter, sub
from typing import NamedTuple

Lines = Sequence[tuple[int, str]]
Shape = tuple[object, ...]

# What a restart changes in a startup's lines and nothing else: the times and the PIDs. Each
# alternative's first character is matched before the rest (the lookbehinds), so the scan of
# a long log tries one character class at most places. No match holds a line break, and none
# names a digit: only digits as a class (what Template.repeats relies on).
_PER_RUN = re.compile(
    r"([\dp\[](?:(?<=\d)\d{3}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?"
    r"|(?<=\d)\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?|(?<=\d)\d:\d\d:\d\d(?:\.\d+)?"
    r"|(?<=p)id=\d+|(?<=\[)\d+:\d+\]))"
)
_number = itemgetter(0)
_text = itemgetter(1)
# ASCII digits as one digit: two texts equal once masked differ in digits only, at the same
# places.
_DIGITS_MASKED = bytes.maketrans(b"0123456789", b"0" * 10)


def shape_of(kept: Lines) -> Shape:
    """A startup's lines with each time and PID replaced by its order of first appearance,
    and the gaps between their line numbers (the key line's place)."""
    text = "\n".join(line for _, line in kept)
    spans = [found.span() for found in _PER_RUN.finditer(text)]
    return _shape(text, spans, kept)


def _shape(text: str, spans: list[tuple[int, int]], kept: Lines) -> Shape:
    values = _slicer(spans)(text)
    parts = _slicer(_between(spans, len(text)))(text)
    order: dict[str, int] = {}
    places = tuple(order.setdefault(value, len(order)) for value in values)
    first = kept[0][0] if kept else 0
    return ("\0".join(parts), places, tuple(n - first for n, _ in kept))


class _Comparison(NamedTuple):
    length: int  # of the template's text
    parts: Callable[[str], tuple[str, ...]]  # a text's pieces outside the times and PIDs
    kept_parts: tuple[str, ...]  # the template's
    # Per time or PID value of the template: its text masked, and a text's pieces where it is.
    groups: list[tuple[bytes, Callable[[str], tuple[str, ...]]]]


class Template:
    """A closed startup (``kept``, at least one line) and the first line of the next one."""

    def __init__(self, kept: Lines, following: tuple[int, str]) -> None:
        first = kept[0][0]
        self.size = len(kept)
        # The line numbers after the first, as distances from it.
        self._gaps = [n - first for n, _ in kept[1:]] + [following[0] - first]
        self._text = "\n".join([*(line for _, line in kept), following[1]])
        self._spans = [found.span() for found in _PER_RUN.finditer(self._text)]
        kept_length = len(self._text) - len(following[1]) - 1
        kept_spans = [span for span in self._spans if span[1] <= kept_length]
        self.shape = _shape(self._text[:kept_length], kept_spans, kept)

    @cached_property
    def _comparison(self) -> _Comparison:
        """What a text is compared with, made at the first startup of the template's size and
        line gaps (most startups of a log of different ones never get there)."""
        text, spans = self._text, self._spans
        parts = _slicer(_between(spans, len(text)))
        # Where each time or PID stands, by value: a repeat has one value in each group, its
        # own in each, equal to the template's but for digits.
        groups: dict[str, list[tuple[int, int]]] = {}
        for start, end in spans:
            groups.setdefault(text[start:end], []).append((start, end))
        places = [(_masked(value), _slicer(group)) for value, group in groups.items()]
        return _Comparison(len(text), parts, parts(text), places)

    def repeats(self, first: tuple[int, str], rest: Lines) -> bool:
        """Whether a startup beginning with ``first``, then ``rest`` (:attr:`size` lines: the
        rest of it and the first line of the one after), repeats the template.

        Equal to the template's text outside its times and PIDs, and equal there but for
        digits, the text's own times and PIDs fall at the same places (their pattern names no
        digit, only digits as a class). With times and PIDs that map one to one, it has the
        template's shape, and the splitter's tests of its lines (markers, errors, which
        API-server PID: patterns that name no digit, and PIDs equal or not) come out as they
        did for the template's.
        """
        if len(rest) != self.size:
            return False
        if list(map(sub, map(_number, rest), repeat(first[0]))) != self._gaps:
            return False
        length, parts, kept_parts, groups = self._comparison
        text = "\n".join(chain((first[1],), map(_text, rest)))
        if len(text) != length or parts(text) != kept_parts:
            return False
        images = set()
        for masked, group in groups:
            values = set(group(text))
            if len(values) != 1:
                return False
            image = values.pop()
            if _masked(image) != masked:
                return False
            images.add(image)
        return len(images) == len(groups)


def _masked(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass").translate(_DIGITS_MASKED)


def _between(spans: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """The stretches of a text of ``length`` outside ``spans`` (one more than there are)."""
    starts = [0, *(end for _, end in spans)]
    ends = [*(start for start, _ in spans), length]
    return list(zip(starts, ends, strict=True))


def _slicer(spans: list[tuple[int, int]]) -> Callable[[str], tuple[str, ...]]:
    """A function giving a text's pieces at ``spans``, in one call into C."""
    slices = [slice(start, end) for start, end in spans]
    if len(slices) > 1:
        return itemgetter(*slices)
    if slices:
        only = slices[0]
        return lambda text: (text[only],)
    return lambda text: ()
