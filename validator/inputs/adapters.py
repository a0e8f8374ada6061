"""Read one scheduler step out of a live engine object, duck-typed (neither engine is imported).

SGLang ``ScheduleBatch`` (what ``Scheduler.get_next_batch_to_run`` returns, before ``run_batch``):

* ``forward_mode``: an enum member whose ``name`` is EXTEND, MIXED, DECODE, TARGET_VERIFY,
  DRAFT_EXTEND (or DRAFT_EXTEND_V2), SPLIT_PREFILL, IDLE, ...; objects with only ``is_idle()`` /
  ``is_target_verify()`` / ``is_draft_extend()`` / ``is_mixed()`` / ``is_decode()`` / ``is_extend()``
  methods and plain strings work too.
* ``reqs`` (each with ``rid`` and ``req_pool_idx``), ``extend_lens`` and ``prefix_lens`` (lists, set
  by ``prepare_for_extend``; under mixed chunking the running decodes are appended with extend
  length 1 and listed again in ``decoding_reqs``), ``seq_lens`` (a tensor; ``seq_lens_cpu`` is
  preferred when present, so no device sync is needed), ``req_pool_indices`` (a tensor; the
  requests' own ``req_pool_idx`` is preferred for the same reason).
* With speculative decoding (``spec_algorithm`` not NONE) a DECODE batch runs the target model as
  a verify forward of ``batch size x speculative_num_draft_tokens`` rows: it is checked as one.
* SGLang 0.5.23: ``Req.kv.req_pool_idx`` and ``Req.extend_len`` (older: ``Req.req_pool_idx``,
  ``Req.extend_input_len``); ``req_pool_indices_cpu`` before the device tensor; ``beam_tail``
  (beam-search member rows appended to a decode batch after the requests' own rows: their slots and
  sequence lengths are in the batch's columns, one row each); ``extend_num_tokens`` (the extend
  forward's rows, checked against the extend lengths); ``global_num_tokens`` (per attention-DP rank
  token counts: a rank's forward is padded to the largest of them under the engine's MAX_LEN DP
  padding, so it is taken as the step's padding rows).
* The requests' ``rid`` are read only when a report names a request (:class:`RequestIds`): a
  legal step's check reads the columns it judges, and an illegal one's reads the ids as well, and
  refuses two requests with one id.

vLLM ``SchedulerOutput`` (what ``Scheduler.schedule()`` returns):

* ``num_scheduled_tokens`` (request id -> tokens this step, speculative tokens included),
  ``total_num_scheduled_tokens``, ``scheduled_new_reqs`` (each with ``req_id`` and
  ``num_computed_tokens``), ``scheduled_cached_reqs`` (``req_ids`` with a parallel
  ``num_computed_tokens`` and ``num_output_tokens`` lists; older releases: a list of objects with
  ``req_id`` and ``num_computed_tokens``), ``scheduled_spec_decode_tokens`` (request id -> draft
  token ids, counted in that request's ``num_scheduled_tokens``).
* The step is one flattened forward: one query row per scheduled token. It is a decode step when
  every request computes exactly one token on top of a computed prefix, an extend step otherwise.
  Under a vLLM profile (``vllm-*``) the profile splits the step as the backend does: a speculative
  request is a decode of ``1 + drafts`` query tokens, not an extend. The fast path bounds the
  step's tokens, which bound every call's rows and query length; a step past the bound takes the
  full check.

Values may be lists, tuples, numpy arrays or tensors (host tensors are read as numpy views, device
tensors through ``tolist()``).
"""
from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from operator import attrgetter, ge
from typing import Any

from ..errors import InputError
from ..facts.fields import MAX_POSITION, MAX_TOKENS, column, ints_within, list_column_top
from ..facts.modes import Mode
from ..facts.names import SGLANG_MODE_METHODS, SGLANG_MODES
from ..engines.forward import query_rows
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())


def is_sglang_batch(obj: Any) -> bool:
    return hasattr(obj, "forward_mode") and hasattr(obj, "reqs")


def is_vllm_output(obj: Any) -> bool:
    return hasattr(obj, "num_scheduled_tokens") and hasattr(obj, "scheduled_new_reqs")


def _as_list(v: Any, where: str):
    """A per-request column as the Checker takes it: lists as they are; numpy arrays, and tensors
    that live in host memory, as numpy arrays (a view: no per-element conversion); anything else
    with ``tolist()`` (a tensor on a device) as a list."""
    if isinstance(v, list):
        return v
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, np.ndarray):
        return v
    to_numpy = getattr(v, "numpy", None)
    if callable(to_numpy) and getattr(getattr(v, "device", None), "type", "cpu") == "cpu":
        try:
            a = to_numpy()
        except (TypeError, RuntimeError, ValueError):
            a = None
        if isinstance(a, np.ndarray):
            return a
    tolist = getattr(v, "tolist", None)
    if tolist is not None:
        out = tolist()
        if isinstance(out, list):
            return out
    raise InputError(where, f"expected a list or a 1-D tensor, got {type(v).__name__}")


# ----------------------------------------------------------------------------------- SGLang
def _spec_on(batch: Any) -> bool:
    alg = getattr(batch, "spec_algorithm", None)
    if alg is None:
        return False
    is_none = getattr(alg, "is_none", None)
    if callable(is_none):
        return not is_none()
    name = getattr(alg, "name", alg)
    return str(name).upper() not in ("NONE", "", "NULL")


def sglang_forward_mode(batch: Any, draft_tokens: int = 0) -> Mode | None:
    """The validator's forward mode of a ScheduleBatch (None: idle, nothing runs)."""
    fm = batch.forward_mode
    name = fm if isinstance(fm, str) else getattr(fm, "name", None)
    if isinstance(name, str):
        key = name.strip().upper()
        if key not in SGLANG_MODES:
            raise InputError("forward_mode", f"unknown SGLang forward mode {name!r}; known: {', '.join(SGLANG_MODES)}")
        mode = SGLANG_MODES[key]
    else:
        for meth, m in SGLANG_MODE_METHODS:
            f = getattr(fm, meth, None)
            if callable(f) and f():
                mode = m
                break
        else:
            raise InputError("forward_mode", f"cannot tell the forward mode of {fm!r}")
    if mode is Mode.DECODE and draft_tokens > 0 and _spec_on(batch):
        return Mode.TARGET_VERIFY
    return mode


class RequestIds(Sequence):
    """An engine step's request ids, read when first used: when the report names a request (a
    finding, the safe split, a listing of the requests), not for every checked step. An SGLang
    step's are each request's ``rid`` as a string, then any beam-search member rows' ids; a vLLM
    step's (``plain``) are its scheduled request ids as strings. The step's requests are held as
    they were when it was read. Reading them raises :class:`InputError` for a request without
    ``rid`` and for two requests with the same id."""

    __slots__ = ("_reqs", "_extra", "_ids", "_plain")

    def __init__(self, reqs, extra: list | None = None, plain: bool = False):
        self._reqs = tuple(reqs)
        self._extra = list(extra or ())
        self._ids: list | None = None
        self._plain = plain

    def ids(self) -> list[str]:
        """The ids as a list (read and checked on the first call)."""
        ids = self._ids
        if ids is None:
            if self._plain:
                ids = [str(r) for r in self._reqs]
            else:
                try:
                    ids = [str(r.rid) for r in self._reqs]
                except AttributeError:
                    i = next(i for i, r in enumerate(self._reqs) if not hasattr(r, "rid"))
                    raise InputError(f"reqs[{i}].rid", "missing: every request of the batch names its id") from None
            ids += self._extra
            if len(set(ids)) != len(ids):
                seen: set = set()
                dup = next(x for x in ids if x in seen or seen.add(x))
                raise InputError("rids", f"duplicate request id {dup!r}" if self._plain
                                 else f"duplicate request id {dup!r} among the batch's requests")
            self._ids = ids
        return ids

    def __len__(self) -> int:
        return len(self._reqs) + len(self._extra)

    def __getitem__(self, i):
        return self.ids()[i]

    def __iter__(self):
        return iter(self.ids())

    def __eq__(self, other) -> bool:
        if isinstance(other, (RequestIds, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"RequestIds({self.ids()!r})" if self._ids is not None else f"RequestIds(<{len(self)} unread>)"


def _merged_decodes(batch: Any, mode: Mode, n: int) -> int:
    if not mode.is_mixed():
        return 0
    dec = getattr(batch, "decoding_reqs", None)
    k = len(dec) if dec else 0
    if k > n:
        raise InputError("decoding_reqs", f"{k} merged decodes but only {n} requests in the batch")
    return k


def _extend_len(r: Any) -> Any:
    """A request's new tokens: ``Req.extend_len`` (SGLang 0.5.23), ``extend_input_len`` before."""
    v = getattr(r, "extend_len", None)
    return r.extend_input_len if v is None else v


def _extend_lens(batch: Any, n: int) -> list:
    v = getattr(batch, "extend_lens", None)
    if v is None:
        return [_extend_len(r) for r in batch.reqs]
    return _as_list(v, "extend_lens")


def _seq_lens(batch: Any) -> list:
    v = getattr(batch, "seq_lens_cpu", None)
    if v is None:
        v = getattr(batch, "seq_lens", None)
    if v is None:
        return [r.seqlen for r in batch.reqs]
    return _as_list(v, "seq_lens")


def _slot(r: Any) -> Any:
    """A request's slot: ``Req.kv.req_pool_idx`` (SGLang 0.5.23), ``Req.req_pool_idx`` before."""
    v = getattr(r, "req_pool_idx", None)
    if v is None:
        v = getattr(getattr(r, "kv", None), "req_pool_idx", None)
    return v


#: a request's slot as each release's ``Req`` holds it (read for a whole step in one C pass)
_SLOT_GETTERS = (attrgetter("req_pool_idx"), attrgetter("kv.req_pool_idx"))


def _slots(batch: Any, members: int = 0) -> list:
    slots = [None]
    if not members:
        reqs = batch.reqs
        # (one getter over every request, picked by the first one; the request-by-request reading for one
        # request, and when a request holds its slot in the other place or not at all)
        if reqs.__class__ is list and len(reqs) > 1:
            get = _SLOT_GETTERS[1] if getattr(reqs[0], "req_pool_idx", None) is None else _SLOT_GETTERS[0]
            try:
                slots = list(map(get, reqs))
            except AttributeError:
                pass
        if None in slots:
            slots = [_slot(r) for r in reqs]
    if None in slots:
        # the host copy first (no device sync), then the device tensor
        v = getattr(batch, "req_pool_indices_cpu", None)
        if v is None:
            v = getattr(batch, "req_pool_indices", None)
        if v is None:
            raise InputError("req_pool_indices", "missing: neither the requests nor the batch name their slots")
        slots = _as_list(v, "req_pool_indices")
    return slots


def _beam_rows(batch: Any, mode: Mode) -> tuple[int, list]:
    """Beam-search member rows riding a decode batch (SGLang 0.5.23 ``ScheduleBatch.beam_tail``):
    ``(count, row ids)``; the batch's row columns (``seq_lens_cpu``, ``req_pool_indices_cpu``) hold
    them after the requests' own rows."""
    tail = getattr(batch, "beam_tail", None)
    if tail is None or not mode.is_decode_or_verify():
        return 0, []
    base = tail.num_base_rows
    if base != len(batch.reqs):
        raise InputError("beam_tail.num_base_rows", f"expected {len(batch.reqs)} (the batch's requests), got {base!r}")
    ids: list = []
    for e in tail.entries:
        m = e.end - e.start
        if m < 0:
            raise InputError("beam_tail.entries", f"a member range ends before it starts ({e.start}..{e.end})")
        rid = batch.reqs[e.leader_idx].rid
        ids.extend(f"{rid}/member{j}" for j in range(m))
    return len(ids), ids


def _padded_rows(batch: Any) -> int | None:
    """Rows the forward is padded to under attention DP: the largest rank's tokens
    (``global_num_tokens``); None without it."""
    g = getattr(batch, "global_num_tokens", None)
    if g is None:
        return None
    g = _as_list(g, "global_num_tokens")
    if not len(g):
        return None
    return int(max(g))


def _check_extend_num_tokens(batch: Any, rows: int) -> None:
    """``extend_num_tokens`` (SGLang: the extend forward's tokens, merged decodes included) must
    agree with the extend lengths the step is judged by."""
    v = getattr(batch, "extend_num_tokens", None)
    if v is not None and int(v) != rows:
        raise InputError("extend_num_tokens", f"expected the sum of extend_lens ({rows}), got {v!r}")


def sglang_lists(batch: Any, checker) -> dict | None:
    """The step as ``Checker`` keyword arguments (``forward_mode`` plus per-request lists); None if idle."""
    mode = sglang_forward_mode(batch, checker.draft_tokens)
    reqs = batch.reqs
    n = len(reqs)
    if mode is None or n == 0:
        return None
    members, member_ids = _beam_rows(batch, mode)
    out: dict = {"forward_mode": mode.value, "rids": RequestIds(reqs, member_ids)}
    if mode.is_routable() or (mode.is_draft_extend() and getattr(batch, "extend_lens", None) is not None):
        out["extend_lens"] = _extend_lens(batch, n)
        pre = getattr(batch, "prefix_lens", None)
        if pre is not None:
            out["prefix_lens"] = _as_list(pre, "prefix_lens")
        else:
            out["seq_lens"] = _seq_lens(batch)
        out["num_merged_decodes"] = _merged_decodes(batch, mode, n)
        if mode.is_routable():
            _check_extend_num_tokens(batch, int(sum(out["extend_lens"])))
    else:
        out["seq_lens"] = _seq_lens(batch)
    if checker.has_slots:
        out["req_pool_indices"] = _slots(batch, members)
    pad = _padded_rows(batch)
    if pad is not None:
        out["padded_rows"] = pad
    return out


_DECODE, _MIXED, _TARGET_VERIFY, _DRAFT_EXTEND = Mode.DECODE, Mode.MIXED, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND


#: an engine's forward-mode enum members seen so far, by id: ``(member, mode, routable)``. A member's
#: name never changes, and the entry holds the member, so its id is not reused while it is here
#: (an enum's ``name`` is a Python property, and its members' hash a Python method).
_MEMBER_MODES: dict = {}
_MEMBER_MODES_MAX = 64


def _member_mode(fm: Any) -> tuple | None:
    """``(fm, mode, routable)`` of an enum member whose name is an SGLang mode (``mode`` None:
    idle), remembered; None for anything else."""
    name = getattr(fm, "name", None)
    mode = SGLANG_MODES.get(name, "?") if name.__class__ is str else "?"
    if mode == "?" or not isinstance(fm, Enum):
        return None
    hit = (fm, mode, mode is not None and mode.is_routable())
    if len(_MEMBER_MODES) < _MEMBER_MODES_MAX:
        _MEMBER_MODES[id(fm)] = hit
    return hit


#: what :func:`sglang_decision` gives for an object that is not an SGLang ``ScheduleBatch``
NOT_SGLANG = object()


def sglang_decision(batch: Any, checker) -> bool | None | object:
    """The verdict's decision for an SGLang ``ScheduleBatch``: ``checker``'s bounds decision
    (:meth:`StepBounds.decide <validate_batch.legality.bounds.StepBounds.decide>`: True legal,
    False illegal, None when only the full check can tell) on the step's forward mode, query rows
    and largest slot; True when nothing runs; :data:`NOT_SGLANG` for an object without ``reqs``
    and ``forward_mode`` (read once each)."""
    try:
        fm = batch.forward_mode
        reqs = batch.reqs
    except AttributeError:
        return NOT_SGLANG
    # (the members from module names: on Python 3.11 each ``Mode.X`` read costs about 0.2 us)
    hit = _MEMBER_MODES.get(id(fm))     # (an entry holds its member: no other object has that id)
    if hit is None:
        hit = _member_mode(fm)
    if hit is None:
        mode = sglang_forward_mode(batch, checker.draft_tokens)
        routable = mode is not None and mode.is_routable()
    else:
        _, mode, routable = hit
        if mode is _DECODE and checker.draft_tokens > 0 and _spec_on(batch):
            mode = _TARGET_VERIFY
            routable = mode.is_routable()
    n = len(reqs)
    if mode is None or n == 0:
        return True
    if (n == 1 and not routable and mode is not _DRAFT_EXTEND and getattr(batch, "beam_tail", None) is None
            and getattr(batch, "global_num_tokens", None) is None):
        # one request of a decode or verify step (the commonest small step): its rows from the checker's
        # table, its slot read here when the request holds a plain int in range (anything else: below)
        rows = checker._one_request_rows_of.get(mode)
        if rows is not None:
            if not checker.has_slots:
                return checker._decide(mode, rows, None)
            s = getattr(reqs[0], "req_pool_idx", None)
            if s.__class__ is int and 1 <= s <= MAX_POSITION:
                return checker._decide(mode, rows, s)
    ext, k = None, 0
    if routable or (mode is _DRAFT_EXTEND and getattr(batch, "extend_lens", None) is not None):
        ext = getattr(batch, "extend_lens", None)
        if not (ext.__class__ is list and len(ext) == n and ints_within(ext, 0, MAX_TOKENS)):
            ext = column(_extend_lens(batch, n), "extend_lens", 0, MAX_TOKENS, n)
        if mode is _MIXED:
            k = _merged_decodes(batch, mode, n)
        if mode is not _DRAFT_EXTEND:
            _check_extend_num_tokens(batch, int(sum(ext)))
    members = _beam_rows(batch, mode)[0] if getattr(batch, "beam_tail", None) is not None else 0
    pad = _padded_rows(batch) if getattr(batch, "global_num_tokens", None) is not None else None
    rows = query_rows(mode, n + members, ext, k, pad, checker.draft_tokens)
    if not checker.has_slots:
        return checker._decide(mode, rows, None)
    # the largest slot, -1 when a request holds the reserved row 0 (Checker.max_slot_of), from the pass
    # that checks the column
    top = list_column_top(_slots(batch, members), "req_pool_indices", 0, MAX_POSITION, n + members, 1)[1]
    return checker._decide(mode, rows, top)


# ----------------------------------------------------------------------------------- vLLM
def _vllm_new_requests(out: Any) -> tuple[dict, dict]:
    """``({request id: num_computed_tokens}, {request id: done prefilling})`` of the step's new
    requests (``NewRequestData``: done when ``num_computed_tokens`` reaches the prompt length)."""
    computed: dict = {}
    done: dict = {}
    for r in out.scheduled_new_reqs or ():
        computed[r.req_id] = r.num_computed_tokens
        plen = getattr(r, "prompt_len", None)         # 0.33: prompt token ids or embeddings
        if not isinstance(plen, int):
            prompt = getattr(r, "prompt_token_ids", None)
            plen = len(prompt) if prompt is not None else 0
        done[r.req_id] = plen > 0 and r.num_computed_tokens >= plen
    return computed, done


def _vllm_requests(out: Any) -> tuple[dict, dict]:
    """``({request id: num_computed_tokens}, {request id: done prefilling})`` of the scheduled
    requests: new requests (:func:`_vllm_new_requests`) and cached ones (``CachedRequestData``'s
    parallel ``req_ids`` / ``num_computed_tokens`` / ``num_output_tokens`` lists: done once it has
    output tokens; older releases: a list of objects with ``req_id`` and ``num_computed_tokens``)."""
    computed, done = _vllm_new_requests(out)
    cached = getattr(out, "scheduled_cached_reqs", None)
    if cached is None:
        return computed, done
    if hasattr(cached, "req_ids"):
        ids = list(cached.req_ids)
        nums = _as_list(cached.num_computed_tokens, "scheduled_cached_reqs.num_computed_tokens")
        if len(ids) != len(nums):
            raise InputError("scheduled_cached_reqs", f"{len(ids)} req_ids but {len(nums)} num_computed_tokens")
        computed.update(zip(ids, nums))
        outs = getattr(cached, "num_output_tokens", None)
        if outs is not None:
            outs = _as_list(outs, "scheduled_cached_reqs.num_output_tokens")
            if len(outs) != len(ids):
                raise InputError("scheduled_cached_reqs", f"{len(ids)} req_ids but {len(outs)} num_output_tokens")
            done.update((i, int(o) > 0) for i, o in zip(ids, outs))
    else:
        for c in cached:
            computed[c.req_id] = c.num_computed_tokens
    return computed, done


def _vllm_tokens(out: Any) -> tuple[list, list]:
    nst = out.num_scheduled_tokens
    if not hasattr(nst, "keys"):
        raise InputError("num_scheduled_tokens", f"expected a mapping of request id -> tokens, got {type(nst).__name__}")
    rids, toks = list(nst.keys()), list(nst.values())
    total = getattr(out, "total_num_scheduled_tokens", None)
    if total is not None and toks and sum(toks) != total:
        raise InputError("total_num_scheduled_tokens",
                         f"expected the sum of num_scheduled_tokens ({sum(toks)}), got {total!r}")
    return rids, toks


def _vllm_spec(out: Any, rids: list, toks: list) -> Any:
    """``scheduled_spec_decode_tokens`` (request id -> draft token ids, part of the request's
    ``num_scheduled_tokens``: one verified token plus the drafts), checked: every drafted request
    is scheduled, with fewer drafts than its scheduled tokens."""
    spec = getattr(out, "scheduled_spec_decode_tokens", None) or {}
    if not hasattr(spec, "items"):
        raise InputError("scheduled_spec_decode_tokens", f"expected a mapping of request id -> token ids, "
                                                         f"got {type(spec).__name__}")
    if not spec:
        return spec
    if spec.__class__ is dict and len(spec) <= len(rids):
        keys = list(spec)
        if keys == rids[:len(keys)]:
            # (the drafted requests lead the scheduled ones, in order, as vLLM lists them: each count
            # against its request's scheduled tokens, in C passes; the loop below names a failure)
            try:
                if not any(map(ge, map(len, spec.values()), toks)):
                    return spec
            except TypeError:
                pass
    sched = dict(zip(rids, toks))
    for rid, ids in spec.items():
        k = len(ids)
        if rid not in sched:
            raise InputError(f"scheduled_spec_decode_tokens[{rid!r}]",
                             "draft tokens for a request that is not scheduled")
        if k >= sched[rid]:
            raise InputError(f"scheduled_spec_decode_tokens[{rid!r}]",
                             f"expected fewer than num_scheduled_tokens ({sched[rid]}) draft tokens, got {k}")
    return spec


def _vllm_done_lead(out: Any, rids: list) -> list | None:
    """The ``num_computed_tokens`` of the step's cached requests when they lead the scheduled ones:
    their parallel lists name ``rids``' first requests, in that order (vLLM schedules the running
    requests before the new ones), every one with output tokens (done prefilling) and computed
    tokens, so the reorder keeps them first and in order. None otherwise (the general reading,
    :func:`_vllm_requests`, then reads every request and says what is wrong with the step)."""
    cached = getattr(out, "scheduled_cached_reqs", None)
    ids = getattr(cached, "req_ids", None)
    if ids.__class__ is not list or not ids or len(ids) > len(rids) or ids != rids[:len(ids)]:
        return None
    nums, outs = getattr(cached, "num_computed_tokens", None), getattr(cached, "num_output_tokens", None)
    if nums.__class__ is not list or outs.__class__ is not list or len(nums) != len(ids) or len(outs) != len(ids):
        return None
    try:
        # (for a real number x, int(x) > 0 exactly when x >= 1: every one done prefilling; and every
        # one with computed tokens)
        if min(outs) >= 1 and min(nums) >= 1:
            return nums
    except TypeError:
        pass
    return None


def _vllm_mode(toks: list, prefix: list, computed: bool = False) -> Mode:
    """Decode when every request (``toks``, validated ints) has one token on top of computed ones
    (``computed``: every prefix is known to be above 0)."""
    if toks.count(1) == len(toks) and (computed or min(prefix) > 0):
        return Mode.DECODE
    return Mode.EXTEND


def vllm_lists(out: Any, checker) -> dict | None:
    """A ``SchedulerOutput`` as ``Checker`` keyword arguments (None: nothing scheduled).

    A step of one token per request on top of computed tokens is a decode step. Any other step is
    an extend step of every request's scheduled tokens (drafts included) on top of its computed
    tokens; for a vLLM profile the requests are listed in the scheduler's order (under model runner
    V1, as its reorder puts them: requests done prefilling first, order kept otherwise) and the
    profile orders and splits them as the runner and the backend do, so a speculative step's
    requests are decodes of ``1 + drafts`` query tokens each."""
    rids, toks = _vllm_tokens(out)
    if not rids:
        return None
    n = len(rids)
    lead = _vllm_done_lead(out, rids)
    if lead is not None:            # (the common step: the requests scheduled before lead, done, in order)
        k = len(lead)
        computed, done = _vllm_new_requests(out)
    else:
        k, lead = 0, []
        computed, done = _vllm_requests(out)
    rest = rids[k:] if k else rids
    missing = [r for r in rest if r not in computed]
    if missing:
        raise InputError("scheduled_new_reqs / scheduled_cached_reqs",
                         f"request {missing[0]!r} is scheduled but its num_computed_tokens is not given")
    drafts = _vllm_spec(out, rids, toks)
    if k < n and getattr(checker, "vllm_steps", False) and getattr(checker, "vllm_order", "v1") == "v1":
        # model runner V1's reorder, first region: requests with computed tokens that are done
        # prefilling (the first k are), then the others, each region in order (V2 sorts by query
        # length alone, which the profile does)
        first = [i for i in range(k, n) if (done.get(rids[i]) or rids[i] in drafts) and computed[rids[i]] > 0]
        if first and k + len(first) < n and first[-1] != k + len(first) - 1:   # (else already in order)
            moved = set(first)
            order = [*range(k), *first, *(i for i in range(k, n) if i not in moved)]
            rids, toks = [rids[i] for i in order], [toks[i] for i in order]
            rest = rids[k:]
    prefix = lead + [computed[r] for r in rest] if k < n else lead
    toks = column(toks, "num_scheduled_tokens", 0, MAX_TOKENS, None)
    prefix = column(prefix, "num_computed_tokens", 0, MAX_POSITION, len(toks))
    ids = RequestIds(rids, plain=True)      # (read when the report names a request)
    if _vllm_mode(toks, prefix, k == n).is_decode():
        return {"forward_mode": Mode.DECODE.value, "rids": ids, "seq_lens": [p + 1 for p in prefix]}
    return {"forward_mode": Mode.EXTEND.value, "rids": ids, "extend_lens": toks, "prefix_lens": prefix}


def _vllm_fast(out: Any, checker) -> tuple | None:
    rids, toks = _vllm_tokens(out)
    if not rids:
        return None
    toks = column(toks, "num_scheduled_tokens", 0, MAX_TOKENS, None)
    if getattr(checker, "vllm_steps", False):
        # a vLLM profile's bound is on the step's tokens: the decode kernel's rows (requests or
        # tokens) and the mixed call's s_q never exceed them; past the bound the full check splits
        # the step as the backend does
        return (Mode.DECODE if max(toks) == 1 else Mode.EXTEND), sum(toks), None
    mode = Mode.EXTEND
    if checker.threshold is not None:  # decode or extend matters only where extend forwards are routed
        lists = vllm_lists(out, checker)
        mode = Mode(lists["forward_mode"])
    return mode, sum(toks), None


# ----------------------------------------------------------------------------------- dispatch
def _planned_batch(obj: Any) -> Any:
    """The batch an SGLang ``NextBatchPlan`` (what 0.5.23's ``get_next_batch_to_run`` returns) will
    run: its ``batch_to_run`` (None: nothing runs). Anything else as it is."""
    if hasattr(obj, "batch_to_run") and hasattr(obj, "running_batch") and not hasattr(obj, "reqs"):
        return obj.batch_to_run
    return obj


def step_lists(obj: Any, checker) -> dict | None:
    """An engine object's step as ``Checker`` keyword arguments; None when nothing runs."""
    obj = _planned_batch(obj)
    if obj is None:
        return None
    if is_sglang_batch(obj):
        return sglang_lists(obj, checker)
    if is_vllm_output(obj):
        return vllm_lists(obj, checker)
    raise InputError("batch", f"expected an SGLang ScheduleBatch, a vLLM SchedulerOutput, a Batch, a batch document "
                              f"or a forward mode with per-request lists, got {type(obj).__name__}")


def fast_decision(obj: Any, checker) -> bool | None:
    """The verdict's decision (:func:`sglang_decision`'s) for an engine object that is not itself a
    ``ScheduleBatch`` (the verdict asks :func:`sglang_decision` first), read as cheaply as possible:
    True when nothing runs."""
    planned = _planned_batch(obj)
    if planned is None:
        return True
    if planned is not obj:      # a NextBatchPlan: the batch it runs
        d = sglang_decision(planned, checker)
        if d is not NOT_SGLANG:
            return d
        obj = planned
    if is_vllm_output(obj):
        fs = _vllm_fast(obj, checker)
        return True if fs is None else checker._decide(*fs)
    step_lists(obj, checker)  # raises the InputError
    return True


def to_batch(obj: Any, checker):
    """The :class:`~validate_batch.inputs.batch.Batch` a checker builds for an engine object (None when idle)."""
    lists = step_lists(obj, checker)
    if lists is None:
        return None
    return checker.batch(lists.pop("forward_mode"), **lists)


__all__ = ["is_sglang_batch", "is_vllm_output", "sglang_forward_mode", "sglang_lists", "vllm_lists", "step_lists",
           "fast_decision", "sglang_decision", "NOT_SGLANG", "to_batch", "SGLANG_MODES", "RequestIds"]
