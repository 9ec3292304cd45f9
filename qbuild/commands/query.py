"""The query language of ``qbuild query``.

    expr := term (op term)*            op: + | union | ^ | intersect | - | except
    term := PATTERN | ( expr )
          | deps(expr [, depth]) | rdeps(universe, expr [, depth])
          | kind('regex', expr) | filter('regex', expr) | attr(name, 'regex', expr)
          | allpaths(from, to)

Operators have equal precedence and group left to right, as in Bazel. Results are sets
of labels, printed sorted. Patterns see every target, including those tagged
``manual`` and each matrix variant. ``attr`` matches the regex against an attribute's
value as text (lists as ``[a, b]``; ``tags`` included).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..analysis.graph import Graph
from ..core.errors import UsageError
from ..core.labels import Label

_TOKEN = re.compile(r"\s*(?:(\()|(\))|(,)|'([^']*)'|\"([^\"]*)\"|([^\s(),]+))")
_OPS = {"+": "union", "union": "union", "^": "intersect", "intersect": "intersect",
        "-": "except", "except": "except"}
_FUNCS = {"deps", "rdeps", "kind", "filter", "attr", "allpaths"}


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise UsageError(f"query: cannot read {text[pos:]!r}")
        pos = match.end()
        if match.group(1):
            out.append(("(", "("))
        elif match.group(2):
            out.append((")", ")"))
        elif match.group(3):
            out.append((",", ","))
        elif match.group(4) is not None or match.group(5) is not None:
            out.append(("str", match.group(4) if match.group(4) is not None else match.group(5)))
        else:
            out.append(("word", match.group(6)))
    return out


class Query:
    def __init__(self, graph: Graph, current_package: str | None) -> None:
        self.graph = graph
        self.current_package = current_package

    def evaluate(self, text: str) -> list[Label]:
        self.tokens = _tokens(text)
        self.pos = 0
        result = self._expr()
        if self.pos != len(self.tokens):
            raise UsageError(f"query: unexpected {self.tokens[self.pos][1]!r}")
        return sorted(result)

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next_is(self, kind: str) -> bool:
        token = self._peek()
        return token is not None and token[0] == kind

    def _take(self, kind: str) -> str:
        token = self._peek()
        if token is None or token[0] != kind:
            found = token[1] if token else "end of query"
            raise UsageError(f"query: expected {kind!r}, found {found!r}")
        self.pos += 1
        return token[1]

    def _expr(self) -> set[Label]:
        result = self._term()
        while (token := self._peek()) is not None and token[0] == "word" and token[1] in _OPS:
            self.pos += 1
            other = self._term()
            op = _OPS[token[1]]
            result = result | other if op == "union" else (
                result & other if op == "intersect" else result - other)
        return result

    def _term(self) -> set[Label]:
        token = self._peek()
        if token is None:
            raise UsageError("query: unexpected end of query")
        if token[0] == "(":
            self.pos += 1
            result = self._expr()
            self._take(")")
            return result
        if token[0] == "word" and token[1] in _FUNCS and self._next_is_paren():
            self.pos += 2
            return self._function(token[1])
        if token[0] in ("word", "str"):
            self.pos += 1
            return self._pattern(token[1])
        raise UsageError(f"query: unexpected {token[1]!r}")

    def _next_is_paren(self) -> bool:
        return self.pos + 1 < len(self.tokens) and self.tokens[self.pos + 1][0] == "("

    def _regex(self) -> re.Pattern[str]:
        token = self._peek()
        regex = self._take("str") if token and token[0] == "str" else self._take("word")
        try:
            return re.compile(regex)
        except re.error as exc:
            raise UsageError(f"query: bad regular expression {regex!r}: {exc}") from None

    def _attr(self) -> set[Label]:
        token = self._peek()
        name = self._take("str") if token and token[0] == "str" else self._take("word")
        self._take(",")
        pattern = self._regex()
        self._take(",")
        inner = self._expr()
        self._take(")")
        found = set()
        for label in inner:
            target = self.graph.targets[label]
            if name == "tags":
                value: object = list(target.tags)
            elif name in target.attrs and name not in target.inactive:
                value = target.attrs[name]
            else:
                continue
            if pattern.search(_text(value)):
                found.add(label)
        return found

    def _function(self, name: str) -> set[Label]:
        if name == "attr":
            return self._attr()
        if name in ("kind", "filter"):
            regex = self._take("str") if self._next_is("str") else \
                self._take("word")
            self._take(",")
            inner = self._expr()
            self._take(")")
            try:
                pattern = re.compile(regex)
            except re.error as exc:
                raise UsageError(f"query: bad regular expression {regex!r}: {exc}") from None
            if name == "kind":
                return {x for x in inner if pattern.search(self.graph.targets[x].kind)}
            return {x for x in inner if pattern.search(str(x))}
        first = self._expr()
        second = None
        depth = None
        if self._next_is(","):
            self.pos += 1
            if name == "deps":
                depth = self._int()
            else:
                second = self._expr()
                if name == "rdeps" and self._next_is(","):
                    self.pos += 1
                    depth = self._int()
        self._take(")")
        if name == "deps":
            return self._reach(first, depth, reverse=False, universe=None)
        if second is None:
            raise UsageError(f"query: {name}() takes two arguments")
        if name == "rdeps":
            return self._reach(second, depth, reverse=True, universe=first)
        forward = self._reach(first, None, reverse=False, universe=None)
        backward = self._reach(second, None, reverse=True, universe=forward)
        return forward & backward

    def _int(self) -> int:
        word = self._take("word")
        if not word.isdigit():
            raise UsageError(f"query: expected a depth, found {word!r}")
        return int(word)

    def _pattern(self, text: str) -> set[Label]:
        labels = self.graph.expand([text], self.current_package, query=True)
        self.graph.analyze(labels)
        return set(labels)

    def _reach(self, start: Iterable[Label], depth: int | None, *, reverse: bool,
               universe: set[Label] | None) -> set[Label]:
        targets = self.graph.targets
        limit: set[Label] = set()
        if reverse:
            assert universe is not None
            self.graph.analyze(sorted(universe))
            closure = set(universe)
            for label in list(universe):
                closure |= self._reach([label], None, reverse=False, universe=None)
            limit = closure
            edges: dict[Label, set[Label]] = {x: set() for x in closure}
            for label in closure:
                for dep in targets[label].deps:
                    edges.setdefault(dep, set()).add(label)
        else:
            self.graph.analyze(sorted(start))
            edges = None  # type: ignore[assignment]
        seen = set(start) & limit if reverse else set(start)
        frontier = list(seen)
        level = 0
        while frontier and (depth is None or level < depth):
            level += 1
            following = []
            for label in frontier:
                nexts = edges.get(label, set()) if reverse else targets[label].deps
                for other in nexts:
                    if other not in seen:
                        seen.add(other)
                        following.append(other)
            frontier = following
        return seen


def _text(value: object) -> str:
    """An attribute value as ``attr()`` matches it: lists as ``[a, b]``, booleans as
    true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if value is None:
        return ""
    return str(value)
