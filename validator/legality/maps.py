"""Legality maps: the verdict of one configuration over two axes, with exact region boundaries.

A map fixes everything but two quantities of a step (engine profile, server arguments, GPU and
FlashMLA build stay as the configuration gives them) and answers, for every cell, legal / fallback
(legal, with the FMLA015 warning: the scheduler's slow low-shared-memory kernel) / illegal (with
the rule codes). Axis pairs (the first is searched, one row per value of the second):

* ``prefill_tokens`` x ``running_decodes``: extend rows of one step, laid out like the seed
  batch's prefill requests; under mixed chunking (``enable_mixed_chunk``) the running decodes are
  merged into the step (one row each), otherwise they run in their own decode step and do not
  change the extend step;
* ``requests`` x ``draft_tokens``: a target-verify step of that many requests with
  ``speculative_num_draft_tokens`` draft tokens;
* ``b`` x ``s_q``: a FlashMLA call record used as a template.

Boundaries are searched, not sampled: each row is walked from its lowest value; the verdict there
is followed with :func:`validate_batch.legality.search.largest_legal` ("same verdict as here") to its exact last
value, starting at the candidate edges the configuration's bounds give (``max_rows``, the routing
threshold, ``slow_above``, moved by the merged decodes or divided by the draft tokens), which makes
a non-monotone row (routing) come out as several segments. Every edge is the last value with the
segment's verdict by the full check, and the value after it has another verdict.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..api import check as check_input
from ..errors import InputError
from ..install_hints import install_hint
from ..guard.checker import Checker
from ..facts.fields import MAX_REQUESTS
from ..inputs.batch import batch_from_dict
from ..facts.knowledge import build_names, resolve_gpu
from .map_axes import AXES, IMAGE_FORMATS, PAIRS  # noqa: F401 (also read from here)
from .search import largest_legal
from ..cli.session import split_device_header
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

KINDS = ("legal", "fallback", "illegal")
FALLBACK_CODE = "FMLA015"
MAX_ROWS_PER_MAP = 1024
MAX_AXIS_VALUE = 1 << 24
#: axes counted in requests: one forward holds at most MAX_REQUESTS
AXIS_MAX = {"requests": MAX_REQUESTS, "running_decodes": MAX_REQUESTS}
#: a requests map checks steps of up to --x-max requests, about 2 log2(--x-max) per segment of each row:
#: its highest value times its rows is held to this, so a map ends in seconds
MAX_MAP_REQUEST_ROWS = 1 << 20


@dataclass(frozen=True)
class Segment:
    """Values ``start..end`` of the searched axis with one verdict (``codes``: the error codes when
    illegal, FMLA015 when falling back)."""

    start: int
    end: int
    kind: str
    codes: tuple = ()

    def to_dict(self) -> dict:
        return {"start": self.start, "end": self.end, "kind": self.kind, "codes": list(self.codes)}


@dataclass(frozen=True)
class Row:
    """One value of the row axis: its segments and the number of full checks its search took."""

    y: int
    segments: tuple
    checks: int

    @property
    def edges(self) -> list[int]:
        """The last value of every segment but the final one (the verdict changes after each)."""
        return [s.end for s in self.segments[:-1]]

    def at(self, x: int) -> Segment | None:
        for s in self.segments:
            if s.start <= x <= s.end:
                return s
        return None

    @property
    def largest_legal(self) -> int | None:
        """The end of the first segment when it is legal (a fallback counts as legal), else None."""
        s = self.segments[0] if self.segments else None
        return s.end if s is not None and s.kind != "illegal" else None

    def to_dict(self) -> dict:
        return {"y": self.y, "edges": self.edges, "largest_legal": self.largest_legal, "checks": self.checks,
                "segments": [s.to_dict() for s in self.segments]}


@dataclass
class LegalityMap:
    """The map of one configuration on one build: rows of exact segments over ``x_range``."""

    build: str
    x_axis: str
    y_axis: str
    x_range: tuple
    rows: list
    label: str = ""
    config: dict = field(default_factory=dict)
    seed: tuple | None = None
    point: tuple | None = None
    hints: dict = field(default_factory=dict)

    @property
    def y_values(self) -> list[int]:
        return [r.y for r in self.rows]

    def row(self, y: int) -> Row:
        for r in self.rows:
            if r.y == y:
                return r
        raise KeyError(y)

    def verdict(self, x: int, y: int) -> Segment:
        """The segment holding ``(x, y)``; ``y`` must be one of the map's rows."""
        s = self.row(y).at(x)
        if s is None:
            raise KeyError((x, y))
        return s

    def grid(self, columns: int = 64) -> tuple[list[int], list[list[Segment]]]:
        """``(x values, cells)``: ``columns`` evenly spaced values of the searched axis and, per row,
        the segment each falls in (read from the exact segments; nothing is re-checked)."""
        lo, hi = self.x_range
        n = max(1, min(columns, hi - lo + 1))
        xs = [lo + (hi - lo) * i // max(1, n - 1) for i in range(n)] if n > 1 else [lo]
        return xs, [[r.at(x) for x in xs] for r in self.rows]

    @property
    def checks(self) -> int:
        return sum(r.checks for r in self.rows)

    def regions(self) -> list[dict]:
        """Every distinct verdict on the map (kind and codes), legal first."""
        seen = {(s.kind, s.codes) for r in self.rows for s in r.segments}
        return [{"kind": k, "codes": list(c)} for k, c in sorted(seen, key=lambda t: (KINDS.index(t[0]), t[1]))]

    def to_dict(self) -> dict:
        return {"build": self.build, "label": self.label, "x_axis": self.x_axis, "y_axis": self.y_axis,
                "x_range": list(self.x_range), "y_values": self.y_values, "config": self.config,
                "seed": list(self.seed) if self.seed else None, "point": list(self.point) if self.point else None,
                "hints": self.hints, "regions": self.regions(), "checks": self.checks,
                "rows": [r.to_dict() for r in self.rows]}


CSV_COLUMNS = ("build", "y_axis", "y", "x_axis", "x_start", "x_end", "kind", "codes")


def boundary_csv(maps: list[LegalityMap]) -> str:
    """One CSV line per segment of every row of every map (codes joined with ``+``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for m in maps:
        for r in m.rows:
            for s in r.segments:
                w.writerow([m.build, m.y_axis, r.y, m.x_axis, s.start, s.end, s.kind, "+".join(s.codes)])
    return buf.getvalue()


# ---------------------------------------------------------------------------------- the source
@dataclass(frozen=True)
class Source:
    """What a map is built from: an engine batch document (its configuration and its own point) or a
    FlashMLA call record (a template)."""

    kind: str                 # "engine" | "call"
    doc: Mapping
    gpu: Any = None           # GPU override (name, raw numbers or a GPU profile)
    label: str = ""


def source_from_documents(docs: list, gpu: Any = None) -> Source:
    """The source of a loaded FILE: one engine batch, or one call record (after an optional device header)."""
    if len(docs) == 1 and isinstance(docs[0], Mapping) and "kind" not in docs[0]:
        batch_from_dict(docs[0], gpu)      # a batch document check accepts (its error otherwise)
        return Source("engine", docs[0], gpu, str(docs[0].get("label", "")))
    calls, g = split_device_header(docs, gpu)
    if len(calls) != 1 or not isinstance(calls[0], Mapping):
        raise InputError("FILE", f"expected one engine batch or one call record, got {len(calls)} documents")
    return Source("call", calls[0], g, str(calls[0].get("label", "")))


def engine_source(engine: str, server_args: Mapping | None = None, gpu: Any = None) -> Source:
    """A configuration without a batch: an engine profile and its settings (no seed point)."""
    return Source("engine", {"engine": engine, "server_args": dict(server_args or {}), "requests": []}, gpu, engine)


# ---------------------------------------------------------------------------------- verdicts
def _segment_of(report) -> tuple[str, tuple]:
    errors = tuple(sorted({f.code for f in report.findings if f.is_error}))
    if errors:
        return "illegal", errors
    if any(f.code == FALLBACK_CODE for f in report.findings):
        return "fallback", (FALLBACK_CODE,)
    return "legal", ()


def _prefill_parts(doc: Mapping) -> int:
    reqs = [r for r in doc.get("requests") or [] if isinstance(r, Mapping) and r.get("extend_tokens")]
    return max(1, len(reqs))


def _split(total: int, parts: int) -> list[int]:
    k = max(1, min(parts, total))
    q, r = divmod(total, k)
    return [q + (1 if i < r else 0) for i in range(k)]


def _checker(src: Source, kernel_build: str | None, extra_args: Mapping | None = None) -> Checker:
    doc = src.doc
    sa = dict(doc.get("server_args") or {})
    sa.update(extra_args or {})
    gpu = src.gpu if src.gpu is not None else doc.get("gpu")     # None: the profile's default GPU
    return Checker(engine=doc.get("engine"), gpu=gpu, server_args=sa, model=doc.get("model") or None,
                   buffers=doc.get("buffers") or None, kernel_build=kernel_build or doc.get("kernel_build"),
                   split=False)


def _hint_points(checker: Checker, to_x: Callable[[int], int]) -> tuple[dict, list[int]]:
    b = checker.bounds
    named = {"max_rows": b.max_rows, "threshold": b.threshold, "slow_above": b.slow_above}
    named = {k: v for k, v in named.items() if v is not None}
    return named, sorted({to_x(v) for v in named.values()})


def _walk(state: Callable[[int], tuple], lo: int, hi: int, hints: list[int]) -> tuple[tuple, int]:
    """The exact segments of ``lo..hi``: from each segment's start, its verdict is followed to its
    last value (starting at the next candidate edge), then checked at the edge and one past it."""
    memo: dict[int, tuple] = {}

    def st(v: int) -> tuple:
        if v not in memo:
            memo[v] = state(v)
        return memo[v]

    segs = []
    pos = lo
    while pos <= hi:
        here = st(pos)
        cand = next((h for h in hints if pos <= h < hi), None)
        end, _ = largest_legal(lambda v: st(v) == here, lo=pos, start=cand, cap=hi, exact_hint=cand is not None)
        if end is None or st(end) != here or (end < hi and st(end + 1) == here):
            raise AssertionError(f"boundary search lost the edge after {pos}")  # the search's own contract
        segs.append(Segment(pos, end, here[0], here[1]))
        pos = end + 1
    return tuple(segs), len(memo)


def _axis_range(name: str, lo: int | None, hi: int | None, flag: str) -> tuple[int, int]:
    _, dlo, dhi = AXES[name]
    lo = dlo if lo is None else lo
    hi = dhi if hi is None else hi
    floor = AXES[name][1]
    top = AXIS_MAX.get(name, MAX_AXIS_VALUE)
    if not (floor <= lo <= hi <= top):
        raise InputError(flag, f"expected {floor} <= min <= max <= {top} for {name}, got {lo}..{hi}")
    return lo, hi


def row_values(lo: int, hi: int, step: int | None = None, extra: tuple = ()) -> list[int]:
    """The rows of a map: ``lo..hi`` by ``step`` (default: at most 65 rows), ``hi`` and ``extra`` too."""
    if step is None:
        step = max(1, -(-(hi - lo) // 64))
    if step < 1:
        raise InputError("--y-step", f"expected a positive step, got {step}")
    vals = set(range(lo, hi + 1, step)) | {hi} | {v for v in extra if v is not None and lo <= v <= hi}
    if len(vals) > MAX_ROWS_PER_MAP:
        raise InputError("--y-step", f"{len(vals)} rows; at most {MAX_ROWS_PER_MAP} (use a larger --y-step)")
    return sorted(vals)


def seed_point(src: Source, x_axis: str) -> tuple | None:
    """The source's own point on the map (None when it has none for these axes)."""
    doc = src.doc
    if src.kind == "call":
        return (int(doc.get("b", 1)), int(doc.get("s_q", 1))) if x_axis == "b" else None
    reqs = [r for r in doc.get("requests") or [] if isinstance(r, Mapping)]
    if not reqs:
        return None
    if x_axis == "prefill_tokens":
        ext = sum(int(r.get("extend_tokens") or 0) for r in reqs)
        decodes = len(doc.get("running") or []) + sum(1 for r in reqs if not r.get("extend_tokens"))
        return (ext, decodes) if ext > 0 else None
    sa = doc.get("server_args") or {}
    k = sa.get("speculative_num_draft_tokens") or sa.get("speculative-num-draft-tokens")
    return (len(reqs), int(k)) if k else None


def _seq_len(doc: Mapping) -> int:
    for r in list(doc.get("running") or []) + list(doc.get("requests") or []):
        if isinstance(r, Mapping) and r.get("seq_len"):
            return int(r["seq_len"])
    return 1024


def _resize_call(call: Mapping, b: int, s_q: int) -> dict:
    out = dict(call)
    out["b"], out["s_q"] = b, s_q
    for key in ("topk_length", "extra_topk_length", "seqlens"):
        v = call.get(key)
        if hasattr(v, "tolist") and not isinstance(v, list):
            v = v.tolist()          # a long list the document reader took in as an array
        if isinstance(v, list) and v:
            out[key] = (v * (b // len(v) + 1))[:b]
    return out


# ---------------------------------------------------------------------------------- the map
def _counted(ys: list, progress: Callable[[int, int], None] | None):
    """``ys`` in order; ``progress(done, total)`` after each row is mapped."""
    for i, y in enumerate(ys):
        yield y
        if progress is not None:
            progress(i + 1, len(ys))


def legality_map(src: Source, x_axis: str = "prefill_tokens", y_axis: str = "running_decodes", *,
                 x_min: int | None = None, x_max: int | None = None, y_min: int | None = None,
                 y_max: int | None = None, y_step: int | None = None, kernel_build: str | None = None,
                 point: tuple | None = None, progress: Callable[[int, int], None] | None = None) -> LegalityMap:
    """The map of ``src`` over ``x_axis`` (searched) and ``y_axis`` (one row per value) on one build
    (``kernel_build``; default: the document's, else the one its engine version ships).
    ``progress(done, total)`` is called after each row."""
    pair = (x_axis, y_axis)
    if pair not in PAIRS:
        raise InputError("--x", f"axes {x_axis} x {y_axis} are not a known pair; pairs: "
                         + ", ".join(f"{a} x {b}" for a, b in PAIRS))
    if PAIRS[pair] != src.kind:
        need = "an engine batch (or --engine)" if PAIRS[pair] == "engine" else "a FlashMLA call record"
        raise InputError("--x", f"axes {x_axis} x {y_axis} need {need}")
    xlo, xhi = _axis_range(x_axis, x_min, x_max, "--x-max")
    ylo, yhi = _axis_range(y_axis, y_min, y_max, "--y-max")
    seed = seed_point(src, x_axis)
    ys = row_values(ylo, yhi, y_step, (seed[1] if seed else None, point[1] if point else None))
    if x_axis == "requests" and xhi * len(ys) > MAX_MAP_REQUEST_ROWS:
        raise InputError("--x-max", f"{xhi} requests x {len(ys)} rows is more than {MAX_MAP_REQUEST_ROWS} "
                                    "(a lower --x-max, or fewer rows with --y-min/--y-max/--y-step)")
    doc = src.doc
    rows: list[Row] = []
    config: dict = {}
    hint_names: dict = {}
    if pair == ("prefill_tokens", "running_decodes"):
        checker = _checker(src, kernel_build)
        build = checker.kernel_build
        parts = _prefill_parts(doc)
        hint_names, raw = _hint_points(checker, lambda v: v)
        config = {"engine": checker.engine, "gpu": checker.gpu.name, "mixed_chunk": checker.mixed_chunk,
                  "server_args": checker.describe()["server_args"]}
        for y in _counted(ys, progress):
            merged = y if checker.mixed_chunk else 0

            def state(x: int, merged=merged) -> tuple:
                ext = _split(x, parts) + [1] * merged
                rep = checker.check("extend", extend_lens=ext, num_merged_decodes=merged)
                return _segment_of(rep)

            segs, n = _walk(state, xlo, xhi, sorted({h - merged for h in raw}))
            rows.append(Row(y, segs, n))
    elif pair == ("requests", "draft_tokens"):
        build = None
        seq = _seq_len(doc)
        for y in _counted(ys, progress):
            checker = _checker(src, kernel_build, {"speculative_num_draft_tokens": y})
            build = checker.kernel_build
            names, raw = _hint_points(checker, lambda v, y=y: v // y)
            hint_names = hint_names or names
            config = config or {"engine": checker.engine, "gpu": checker.gpu.name}

            def state(x: int, checker=checker) -> tuple:
                return _segment_of(checker.check("target_verify", seq_lens=np.full(x, seq, dtype=np.int64)))

            segs, n = _walk(state, xlo, xhi, raw)
            rows.append(Row(y, segs, n))
    else:
        gpu = resolve_gpu(src.gpu) if isinstance(src.gpu, str) else src.gpu
        probe = check_input(_resize_call(doc, 1, 1), gpu=gpu, build=kernel_build)
        build = probe.plans[0].gen["build"] if probe.plans else (kernel_build or "")
        config = {"call": {k: v for k, v in doc.items() if not isinstance(v, list) and not hasattr(v, "tolist")},
                  "gpu": getattr(gpu, "name", str(gpu))}
        for y in _counted(ys, progress):
            def state(x: int, y=y) -> tuple:
                return _segment_of(check_input(_resize_call(doc, x, y), gpu=gpu, build=kernel_build))

            segs, n = _walk(state, xlo, xhi, [])
            rows.append(Row(y, segs, n))
    return LegalityMap(build=build, x_axis=x_axis, y_axis=y_axis, x_range=(xlo, xhi), rows=rows,
                       label=src.label, config=config, seed=seed, point=tuple(point) if point else None,
                       hints=hint_names)


def maps_across_builds(src: Source, x_axis: str = "prefill_tokens", y_axis: str = "running_decodes",
                       **kwargs) -> list[LegalityMap]:
    """The same map on every known FlashMLA build (:func:`validate_batch.facts.knowledge.build_names`)."""
    kwargs.pop("kernel_build", None)
    progress = kwargs.pop("progress", None)
    names = build_names()
    out = []
    for i, name in enumerate(names):
        # one count over every build: rows done so far, of about len(names) times this map's rows
        tick = (lambda done, total, i=i: progress(i * total + done, len(names) * total)) if progress else None
        out.append(legality_map(src, x_axis, y_axis, kernel_build=name, progress=tick, **kwargs))
    return out


# ---------------------------------------------------------------------------------- pictures
COLORS = {"legal": "#2e9d4a", "fallback": "#f5a623", "illegal": "#d0312d"}


def _pyplot():
    try:
        import matplotlib  # noqa: PLC0415 (optional: only pictures need it)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise InputError("-o", f"PNG/SVG output needs matplotlib: {install_hint('map')} "
                         "(terminal, JSON and CSV output work without it)") from None
    return plt


def _draw(ax, m: LegalityMap, columns: int = 480) -> None:
    lo, hi = m.x_range
    ys = m.y_values
    # each row's band reaches halfway to its neighbours
    mids = [(a + b) / 2 for a, b in zip(ys, ys[1:])]
    bottoms = [ys[0] - 0.5] + mids
    tops = mids + [ys[-1] + 0.5]
    for r, y0, y1 in zip(m.rows, bottoms, tops):
        for s in r.segments:
            ax.fill_between([s.start - 0.5, s.end + 0.5], y0, y1, color=COLORS[s.kind], linewidth=0)
    # the boundaries: every edge of every row, joined row to row while the segment count is the same
    n_edges = max(len(r.edges) for r in m.rows)
    for i in range(n_edges):
        xs, yb = [], []
        for r, y0, y1 in zip(m.rows, bottoms, tops):
            if i < len(r.edges):
                e = r.edges[i] + 0.5
                xs += [e, e]
                yb += [y0, y1]
            elif xs:
                ax.plot(xs, yb, color="black", linewidth=1.2)
                xs, yb = [], []
        if xs:
            ax.plot(xs, yb, color="black", linewidth=1.2)
    # labels: each region's codes at the middle of its widest segment
    widest: dict = {}
    for r in m.rows:
        for s in r.segments:
            key = (s.kind, s.codes)
            if key not in widest or s.end - s.start > widest[key][1].end - widest[key][1].start:
                widest[key] = (r.y, s)
    for (kind, codes), (y, s) in widest.items():
        if kind == "legal":
            continue
        ax.text((s.start + s.end) / 2, (ys[0] + ys[-1]) / 2, "\n".join(codes), ha="center", va="center",
                fontsize=8, color="black")
    if m.seed:
        ax.plot([m.seed[0]], [m.seed[1]], marker="o", markersize=7, markerfacecolor="white",
                markeredgecolor="black", linestyle="none", label="seed batch", clip_on=False)
    if m.point:
        ax.plot([m.point[0]], [m.point[1]], marker="X", markersize=8, markerfacecolor="#1f5fbf",
                markeredgecolor="white", linestyle="none", label="your batch", clip_on=False)
    ax.set_xlim(lo - 0.5, hi + 0.5)
    ax.set_ylim(bottoms[0], tops[-1])
    ax.set_title(m.build, fontsize=10)
    ax.set_xlabel(m.x_axis.replace("_", " "), fontsize=8)
    ax.set_ylabel(m.y_axis.replace("_", " "), fontsize=8)
    ax.tick_params(labelsize=7)


def render_figure(maps: list[LegalityMap]):
    """A matplotlib figure: one panel per map (side by side for several builds), regions colored
    (legal green, fallback amber, illegal red, labeled by rule), the boundaries drawn as lines, the
    seed batch and the user's point marked. Needs matplotlib (the ``map`` extra)."""
    plt = _pyplot()
    from matplotlib.patches import Patch  # noqa: PLC0415

    if not maps:
        raise InputError("maps", "nothing to draw")
    n = len(maps)
    cols = min(3, n)
    nrows = -(-n // cols)
    # one panel: 8 x 6 in (800 x 600 px at the default 100 dpi); several: 4.8 x 3.8 in each
    size = (8.0, 6.0) if n == 1 else (4.8 * cols, 3.8 * nrows + 0.8)
    fig, axes = plt.subplots(nrows, cols, figsize=size, squeeze=False)
    for ax, m in zip(axes.flat, maps):
        _draw(ax, m)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles = [Patch(color=COLORS[k], label=k) for k in KINDS]
    handles += [h for h in axes.flat[0].get_legend_handles_labels()[0]]
    title = maps[0].label or " ".join(maps[0].config.get("engine", []))
    fig.suptitle(f"legality map: {title}" if title else "legality map", fontsize=11)
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


def save_image(maps: list[LegalityMap], path: str, dpi: int = 100) -> None:
    """Write the figure to ``path`` (.png or .svg by its extension)."""
    ext = path.rsplit(".", 1)[-1].lower()
    if ext not in IMAGE_FORMATS:
        raise InputError("-o", f"expected a .png or .svg file, got {path!r}")
    fig = render_figure(maps)
    plt = _pyplot()
    try:
        fig.savefig(path, dpi=dpi, format=ext)
    finally:
        plt.close(fig)
