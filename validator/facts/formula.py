"""Size formulas written in the data files: a small integer arithmetic language, evaluated here only.

A formula is a string in a data file (``"4*(5b+1)"``: the scheduler's shared memory in bytes for
``b`` query rows). It is parsed once (:func:`parse`, cached by its text) into a :class:`Formula`
that evaluates on ints or element-wise on numpy int64 arrays, shows its own text where a message
quotes it, and answers the question every limit asks: the largest ``b`` whose bytes fit
(:meth:`Formula.largest`).

Grammar (nothing else is accepted; the text is never handed to Python's ``eval``)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "//") factor)*
    factor := "-" factor | atom
    atom   := INT | INT NAME | NAME | FUNC "(" expr ("," expr)* ")" | "(" expr ")"

* ``INT NAME`` written together (``5b``, ``8P``) is the product, binding tighter than ``*`` and
  ``//``: ``4//2b`` is ``4 // (2*b)``.
* ``//`` is floor division, as C++ integer division on the non-negative sizes formulas describe.
* Functions: ``min(x, y, ...)``, ``max(x, y, ...)``, ``cdiv(x, m)`` (ceil division) and
  ``align(x, m)`` (``x`` rounded up to a multiple of ``m``).
* Names: the variables in :data:`VARIABLES`; a formula may be held to fewer (``names``).
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from functools import lru_cache, reduce
from typing import Callable, Iterable, Mapping
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


#: the variables a formula may name, and what each stands for
VARIABLES = {
    "b": "query rows (or requests) of the call",
    "P": "partitions of the call (num_sm_parts)",
    "s_q": "query tokens per request",
    "h_q": "query heads",
    "h_k": "key heads",
    "d_qk": "query/key head size",
    "d_v": "value head size",
    "topk": "selected keys per query",
    "num_sms": "streaming multiprocessors of the GPU",
}
MAX_FORMULA_CHARS = 400      # one formula's text
MAX_FORMULA_DEPTH = 32       # nesting of parentheses, calls and unary minus
SEARCH_CEILING = 1 << 62     # the integer search's last value when the caller gives no upper bound

_TOKEN = re.compile(r"(?:(?P<int>\d+)(?P<coef>[A-Za-z_][A-Za-z_0-9]*)?|(?P<name>[A-Za-z_][A-Za-z_0-9]*)"
                    r"|(?P<op>//|[-+*(),]))")


class FormulaError(ValueError):
    """A formula in a data file that cannot be parsed or evaluated; ``field`` names the data field."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


def _cdiv(x, m):
    return -(-x // m)


def _align(x, m):
    return -(-x // m) * m


def _min(*xs):
    if any(isinstance(x, np.ndarray) for x in xs):
        return reduce(np.minimum, xs)
    return min(xs)


def _max(*xs):
    if any(isinstance(x, np.ndarray) for x in xs):
        return reduce(np.maximum, xs)
    return max(xs)


#: function name -> (implementation, number of arguments: exact, or None for two or more)
FUNCTIONS: dict[str, tuple[Callable, int | None]] = {
    "min": (_min, None), "max": (_max, None), "cdiv": (_cdiv, 2), "align": (_align, 2),
}
_BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv}


def _tokens(text: str, fname: str) -> list[tuple[str, object]]:
    """``(kind, value)`` pairs: ``int``, ``coef`` (``(int, name)``), ``name``, ``op``; then ``end``."""
    out: list[tuple[str, object]] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos == n:
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise FormulaError(fname, f"unexpected {text[pos]!r} at character {pos + 1} of {text!r} "
                                      "(a formula has integers, names, + - * // ( ) , only)")
        if m.group("coef"):
            out.append(("coef", (int(m.group("int")), m.group("coef"))))
        elif m.group("int"):
            out.append(("int", int(m.group("int"))))
        elif m.group("name"):
            out.append(("name", m.group("name")))
        else:
            out.append(("op", m.group("op")))
        pos = m.end()
    out.append(("end", None))
    return out


class _Parser:
    """Recursive descent over the tokens; builds tuples ``(kind, ...)`` (see :func:`_compile`)."""

    def __init__(self, text: str, fname: str, names: frozenset):
        self.text, self.fname, self.names = text, fname, names
        self.toks = _tokens(text, fname)
        self.i = 0
        self.depth = 0

    def fail(self, message: str):
        raise FormulaError(self.fname, f"{message} in {self.text!r}")

    def peek(self) -> tuple[str, object]:
        return self.toks[self.i]

    def take(self) -> tuple[str, object]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, op: str):
        kind, value = self.take()
        if (kind, value) != ("op", op):
            self.fail(f"expected {op!r}, got {_show(kind, value)}")

    def parse(self):
        node = self.expr()
        kind, value = self.peek()
        if kind != "end":
            self.fail(f"unexpected {_show(kind, value)}")
        return node

    def expr(self):
        node = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            node = (self.take()[1], node, self.term())
        return node

    def term(self):
        node = self.factor()
        while self.peek() in (("op", "*"), ("op", "//")):
            node = (self.take()[1], node, self.factor())
        return node

    def factor(self):
        if self.peek() == ("op", "-"):
            self.take()
            return ("neg", self.nested(self.factor))
        return self.atom()

    def nested(self, step):
        self.depth += 1
        if self.depth > MAX_FORMULA_DEPTH:
            self.fail(f"nested deeper than {MAX_FORMULA_DEPTH}")
        node = step()
        self.depth -= 1
        return node

    def variable(self, name: str):
        if name not in self.names:
            allowed = ", ".join(sorted(self.names)) or "none"
            self.fail(f"unknown name {name!r} (a formula here may name: {allowed})")
        return ("var", name)

    def atom(self):
        kind, value = self.take()
        if kind == "int":
            return ("int", value)
        if kind == "coef":
            k, name = value
            return ("*", ("int", k), self.variable(name))
        if kind == "name" and self.peek() == ("op", "("):
            return self.call(value)
        if kind == "name":
            return self.variable(value)
        if (kind, value) == ("op", "("):
            node = self.nested(self.expr)
            self.expect(")")
            return node
        self.fail(f"expected a number, a name or '(', got {_show(kind, value)}")

    def call(self, name: str):
        if name not in FUNCTIONS:
            self.fail(f"unknown function {name!r} (known: {', '.join(FUNCTIONS)})")
        self.expect("(")
        args = [self.nested(self.expr)]
        while self.peek() == ("op", ","):
            self.take()
            args.append(self.nested(self.expr))
        self.expect(")")
        want = FUNCTIONS[name][1]
        if (want is None and len(args) < 2) or (want is not None and len(args) != want):
            self.fail(f"{name}() takes {'two or more' if want is None else want} arguments, got {len(args)}")
        return ("call", name, tuple(args))


def _show(kind: str, value) -> str:
    if kind == "end":
        return "the end"
    if kind == "coef":
        return repr(f"{value[0]}{value[1]}")
    return repr(str(value))


def _compile(node, fname: str) -> Callable[[Mapping], object]:
    """A function of the variables' values that computes ``node``."""
    kind = node[0]
    if kind == "int":
        v = node[1]
        return lambda env: v
    if kind == "var":
        name = node[1]

        def var(env):
            try:
                return env[name]
            except KeyError:
                raise FormulaError(fname, f"no value given for {name!r}") from None
        return var
    if kind == "neg":
        f = _compile(node[1], fname)
        return lambda env: -f(env)
    if kind == "call":
        fn = FUNCTIONS[node[1]][0]
        args = tuple(_compile(a, fname) for a in node[2])
        if node[1] in ("cdiv", "align"):
            return _guarded(lambda env: fn(*(a(env) for a in args)), fname)
        return lambda env: fn(*(a(env) for a in args))
    op = _BINARY[kind]
    left, right = _compile(node[1], fname), _compile(node[2], fname)
    if kind == "//":
        return _guarded(lambda env: op(left(env), right(env)), fname)
    return lambda env: op(left(env), right(env))


def _guarded(f: Callable, fname: str) -> Callable:
    def run(env):
        try:
            return f(env)
        except ZeroDivisionError:
            raise FormulaError(fname, "division by zero") from None
    return run


def _affine(node) -> tuple[int, dict] | None:
    """``(c, {name: a})`` with ``node == c + sum(a * name)`` exactly on integers (None: the formula
    is not affine: a product of variables, or ``//``, a function of one)."""
    kind = node[0]
    if kind == "int":
        return node[1], {}
    if kind == "var":
        return 0, {node[1]: 1}
    if kind == "neg":
        inner = _affine(node[1])
        return None if inner is None else (-inner[0], {k: -a for k, a in inner[1].items()})
    if kind not in ("+", "-", "*"):
        return None
    left, right = _affine(node[1]), _affine(node[2])
    if left is None or right is None:
        return None
    (c1, t1), (c2, t2) = left, right
    if kind == "*":
        if t1 and t2:
            return None
        (k, t) = (c2, t1) if t1 else (c1, t2)
        return c1 * c2, {n: a * k for n, a in t.items()}
    sign = 1 if kind == "+" else -1
    terms = dict(t1)
    for n, a in t2.items():
        terms[n] = terms.get(n, 0) + sign * a
    return c1 + sign * c2, terms


def _compile_affine(c: int, terms: dict, fname: str) -> Callable[[Mapping], object]:
    """``c + sum(a * values[name])``: the same integers as the tree, in one step."""
    terms = tuple((n, a) for n, a in terms.items() if a)

    def missing(env):
        n = next(n for n, _ in terms if n not in env)
        raise FormulaError(fname, f"no value given for {n!r}")

    if len(terms) == 1:
        (name, a), = terms

        def one(env):
            try:
                return c + a * env[name]
            except KeyError:
                missing(env)
        return one

    def run(env):
        try:
            return c + sum(a * env[n] for n, a in terms)
        except KeyError:
            missing(env)
    return run


def _linear(node, var: str, env: Mapping) -> tuple[int, int] | None:
    """``(a, c)`` with ``node == a*var + c`` for the other variables' values in ``env`` (None: the
    formula is not linear in ``var``)."""
    kind = node[0]
    if kind == "int":
        return 0, node[1]
    if kind == "var":
        return (1, 0) if node[1] == var else (0, env[node[1]])
    if kind == "neg":
        inner = _linear(node[1], var, env)
        return None if inner is None else (-inner[0], -inner[1])
    parts = [_linear(n, var, env) for n in (node[2] if kind == "call" else node[1:])]
    if any(p is None for p in parts):
        return None
    if kind in ("+", "-"):
        (a1, c1), (a2, c2) = parts
        return (a1 + a2, c1 + c2) if kind == "+" else (a1 - a2, c1 - c2)
    if kind == "*":
        (a1, c1), (a2, c2) = parts
        if a1 and a2:
            return None
        return a1 * c2 + a2 * c1, c1 * c2
    if any(a for a, _ in parts):          # //, min, max, cdiv, align of the variable: not linear
        return None
    fn = FUNCTIONS[node[1]][0] if kind == "call" else _BINARY[kind]
    try:
        return 0, fn(*(c for _, c in parts))
    except ZeroDivisionError:
        return None                        # the evaluation names the field


@dataclass(frozen=True, eq=False)
class Formula:
    """One parsed formula: ``text`` as the data file writes it, ``field`` the data field it came from."""

    text: str
    data_field: str
    tree: tuple = field(repr=False)
    variables: frozenset = frozenset()

    def __post_init__(self):
        affine = _affine(self.tree)
        run = _compile(self.tree, self.data_field) if affine is None else _compile_affine(*affine, self.data_field)
        object.__setattr__(self, "_run", run)

    def __str__(self) -> str:
        """The formula as the data writes it (how findings and tables show it)."""
        return self.text

    def __call__(self, **values):
        """The formula's value for these variables (ints, or numpy int64 arrays element-wise)."""
        return self._run(values)

    def evaluate(self, values: Mapping):
        """:meth:`__call__` with the variables in a mapping."""
        return self._run(values)

    def linear(self, var: str = "b", **values) -> tuple[int, int] | None:
        """``(a, c)`` such that the formula is ``a*var + c`` for these other values, or None."""
        self._require(values, var)
        return _linear(self.tree, var, values)

    def largest(self, var: str = "b", limit: int = 0, lo: int = 0, hi: int | None = None, **values) -> int:
        """The largest integer ``var`` in ``[lo, hi]`` whose value is ``<= limit``, the other variables
        held at ``values``; ``lo - 1`` when none is. Exact for a formula non-decreasing in ``var``:
        closed form when it is linear, an integer search otherwise. ``hi`` None: no upper bound
        (a formula that never exceeds ``limit`` is then an error)."""
        self._require(values, var)
        used = tuple(sorted((k, int(values[k])) for k in self.variables if k != var))
        return _largest(self, var, int(limit), int(lo), hi, used)

    def _require(self, values: Mapping, var: str):
        missing = sorted(self.variables - set(values) - {var})
        if missing:
            raise FormulaError(self.data_field, f"no value given for {', '.join(map(repr, missing))} in {self.text!r}")

    def _unbounded(self, var: str, limit: int):
        raise FormulaError(self.data_field, f"{self.text!r} stays <= {limit} for every {var}: no largest {var}")


@lru_cache(maxsize=4096)
def _largest(f: Formula, var: str, limit: int, lo: int, hi: int | None, values: tuple) -> int:
    env = dict(values)
    lin = _linear(f.tree, var, env)
    if lin is not None:
        a, c = lin
        if a < 0:
            raise FormulaError(f.data_field, f"{f.text!r} decreases as {var} grows: no largest {var} can be read from it")
        if a == 0:
            if c > limit:
                return lo - 1
            return hi if hi is not None else f._unbounded(var, limit)
        top = (limit - c) // a            # the largest integer with a*top + c <= limit
        top = top if hi is None else min(top, hi)
        return top if top >= lo else lo - 1
    return _search(f, var, limit, lo, hi, env)


def _search(f: Formula, var: str, limit: int, lo: int, hi: int | None, env: dict) -> int:
    """Exponential then binary search for a non-decreasing formula."""
    def fits(v: int) -> bool:
        env[var] = v
        return f.evaluate(env) <= limit

    if (hi is not None and hi < lo) or not fits(lo):
        return lo - 1
    ceiling = hi if hi is not None else SEARCH_CEILING
    good, step = lo, 1
    while True:                          # grow until a value does not fit (or the ceiling fits)
        bad = min(good + step, ceiling)
        if bad == good:
            return good if hi is not None else f._unbounded(var, limit)
        if not fits(bad):
            break
        good, step = bad, step * 2
    while bad - good > 1:                # fits(good), not fits(bad)
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def _names_in(node) -> Iterable[str]:
    if node[0] == "var":
        yield node[1]
    elif node[0] == "call":
        for a in node[2]:
            yield from _names_in(a)
    elif node[0] != "int":
        for n in node[1:]:
            yield from _names_in(n)


@lru_cache(maxsize=1024)
def parse(text: str, fname: str = "", names: Iterable[str] | None = None) -> Formula:
    """Parse the formula ``text`` of data field ``fname``; ``names``: the variables it may name
    (a tuple; default: every one of :data:`VARIABLES`). Cached: each text is parsed once per field."""
    if not isinstance(text, str):
        raise FormulaError(fname, f"expected a formula string, got {type(text).__name__}")
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaError(fname, f"a formula is at most {MAX_FORMULA_CHARS} characters, got {len(text)}")
    allowed = frozenset(VARIABLES if names is None else names)
    if not allowed <= set(VARIABLES):
        raise ValueError(f"unknown formula variables {sorted(allowed - set(VARIABLES))}")
    tree = _Parser(text, fname, allowed).parse()
    return Formula(text, fname, tree, frozenset(_names_in(tree)))


def formula_field(record: Mapping, key: str, fname: str, names: Iterable[str] | None = None) -> Formula:
    """The formula under ``record[key]``, ``fname`` naming the record (the error names ``fname.key``)."""
    if key not in record:
        raise FormulaError(f"{fname}.{key}", "missing (a formula string, e.g. \"4*(5b+1)\")")
    return parse(record[key], f"{fname}.{key}", None if names is None else tuple(names))
