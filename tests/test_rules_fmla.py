"""FMLA0xx kernel limits, each at limit-1, limit and limit+1 (table-driven, one test per rule).

Expected verdicts and numbers come from the arithmetic of the facts written out here (shared-memory
bytes, partition formulas, offsets, strides, workspace bytes) or from schedules recomputed by brute
force; never from the rule code under test. The real kernel's verdicts are in test_oracle.py.
"""
from __future__ import annotations

import pytest

from validate_batch.api import check_calls
from validate_batch.flashmla.plan import plan

INT32_MAX = 2**31 - 1
H200_SMEM = 232448           # shared_memory_per_block_optin measured on the H200


def report_for(rec: dict, gpu="H200"):
    return check_calls([rec], gpu)


def findings(rec: dict, code: str, gpu="H200"):
    return [f for f in report_for(rec, gpu).findings if f.code == code]


def sparse(b: int = 8, **kw) -> dict:
    rec = {"kind": "sparse", "b": b, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 128}
    rec.update(kw)
    return rec


def dense(b: int = 8, length: int = 100, **kw) -> dict:
    rec = {"kind": "dense", "b": b, "s_q": 1, "h_q": 64, "seqlens": [length] * b}
    rec.update(kw)
    return rec


def raw_gpu(num_sms=132, cc=(9, 0), smem=H200_SMEM, **kw) -> dict:
    return {"num_sms": num_sms, "cc": list(cc), "smem_optin": smem, **kw}


# ------------------------------------------------------------------------------------------------
# FMLA001 scheduler shared memory: 4*(5b+1) bytes <= smem_optin
# ------------------------------------------------------------------------------------------------
def sched_smem(b: int) -> int:
    return 4 * (5 * b + 1)


def test_fmla001_h200_arithmetic():
    """The facts' boundary on the H200: 232444 B fit at b = 11622, 232464 B do not at 11623."""
    assert sched_smem(11622) == 232444 <= H200_SMEM < sched_smem(11623) == 232464


FMLA001_CASES = [
    # (gpu, smem_optin, record maker)
    ("H200", H200_SMEM, lambda b: sparse(b)),
    ("H200", H200_SMEM, lambda b: sparse(b, s_q=4, topk=512)),
    ("H200", H200_SMEM, lambda b: sparse(b, h_q=128, topk=2048, d_qk=576)),
    ("H200", H200_SMEM, lambda b: sparse(b, topk=128, extra_topk=512)),
    ("H200", H200_SMEM, lambda b: dense(b, 64, h_q=16)),
    ("H100-SXM", H200_SMEM, lambda b: sparse(b)),
    ("H20", H200_SMEM, lambda b: dense(b, 5000, s_q=2, h_q=128)),
    ("B200", H200_SMEM, lambda b: sparse(b, h_q=128, topk=512)),
    (raw_gpu(smem=101376), 101376, lambda b: sparse(b)),
    (raw_gpu(smem=4 * (5 * 1000 + 1)), 20004, lambda b: sparse(b)),     # exactly full at b = 1000
    (raw_gpu(num_sms=78, smem=49152), 49152, lambda b: dense(b, 1)),
]


@pytest.mark.parametrize("gpu, smem, make", FMLA001_CASES)
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_fmla001_sched_smem(gpu, smem, make, delta):
    limit = max(b for b in range(1, smem // 20 + 2) if sched_smem(b) <= smem)
    assert sched_smem(limit) <= smem < sched_smem(limit + 1)
    b = limit + delta
    got = findings(make(b), "FMLA001", gpu)
    if sched_smem(b) <= smem:
        assert got == []
        return
    assert len(got) == 1
    f = got[0]
    assert f.severity == "error"
    assert f.numbers == {"b": b, "max_b": limit, "smem_bytes": sched_smem(b), "smem_limit": smem}
    assert str(b) in f.message and str(limit) in f.message
    assert f"at least {-(-b // limit)} calls" in f.fix


def test_fmla001_h200_literal_boundary():
    assert findings(sparse(11621), "FMLA001") == []
    assert findings(sparse(11622), "FMLA001") == []
    (f,) = findings(sparse(11623), "FMLA001")
    assert f.numbers == {"b": 11623, "max_b": 11622, "smem_bytes": 232464, "smem_limit": 232448}
    (f,) = findings(sparse(12288, topk=512), "FMLA001")
    assert f.numbers["smem_bytes"] == 245764 and "at least 2 calls" in f.fix
    # many times the limit: the split is ceil(b / 11622) calls
    (f,) = findings(sparse(100000), "FMLA001")
    assert "at least 9 calls" in f.fix


# ------------------------------------------------------------------------------------------------
# FMLA002 32-bit o_accum offset: (largest split row) * s_q*h_q*512 < 2^31
# ------------------------------------------------------------------------------------------------
def split_rows_bruteforce(num_splits: list[int]) -> tuple[int, int]:
    """(largest last-row index of a split request, that request), (-1, -1) when nothing splits."""
    best = (-1, -1)
    for r in range(len(num_splits) - 1):
        if num_splits[r + 1] - num_splits[r] > 1:
            best = max(best, (num_splits[r + 1] - 1, r))
    return best


def reference_split_row(rec: dict, gpu="H200") -> tuple[int, int]:
    return split_rows_bruteforce(plan(rec, gpu).reference_schedule().num_splits.tolist())


def max_legal_row(stride: int) -> int:
    """Largest row R with R * stride < 2^31 (written as a search, not as a division)."""
    r = 2**31 // stride
    while r * stride >= 2**31:
        r -= 1
    assert (r + 1) * stride >= 2**31
    return r


def search_calls_by_row(make, b_values, lengths, targets) -> dict:
    """Search (length, b) with the reference loop for calls whose largest split row is each target."""
    found = {}
    for length in lengths:
        for b in b_values:
            rec = make(b, length)
            row, _ = reference_split_row(rec)
            if row in targets and row not in found:
                found[row] = rec
                if len(found) == len(targets):
                    return found
    return found


def _one_long_request(kind, s_q, h_q):
    """b-1 one-block requests and one huge last one that every partition ends up sharing."""
    def make(b, length):
        if kind == "dense":
            return {"kind": "dense", "b": b, "s_q": s_q, "h_q": h_q, "seqlens": [1] * (b - 1) + [length]}
        return {"kind": "sparse", "b": b, "s_q": s_q, "h_q": h_q, "d_qk": 512, "topk": length,
                "topk_length": [1] * (b - 1) + [length]}
    return make


FMLA002_SHAPES = [
    # (id, s_q, h_q, record maker (b, length), b values, lengths to search)
    ("sparse-s8-h128", 8, 128, lambda b, L: sparse(b, s_q=8, h_q=128, topk=L), range(4660, 4700), (1536, 2048)),
    ("dense-s8-h128", 8, 128, lambda b, L: dense(b, L, s_q=8, h_q=128), range(4660, 4700), (1536, 2048)),
    ("sparse-s16-h128", 16, 128, lambda b, L: sparse(b, s_q=16, h_q=128, topk=L), range(2715, 2745), (1536, 2048)),
    ("sparse-s16-h64", 16, 64, lambda b, L: sparse(b, s_q=16, h_q=64, topk=L), range(4660, 4700), (1536, 2048)),
    ("sparse-s4-h128-long-last", 4, 128, _one_long_request("sparse", 4, 128), range(8160, 8200), (2**22,)),
    ("dense-s8-h64-long-last", 8, 64, _one_long_request("dense", 8, 64), range(8160, 8200), (2**31 - 1,)),
]


@pytest.mark.parametrize("s_q, h_q, make, b_values, lengths", [s[1:] for s in FMLA002_SHAPES],
                         ids=[s[0] for s in FMLA002_SHAPES])
def test_fmla002_oaccum_offset(s_q, h_q, make, b_values, lengths):
    stride = s_q * h_q * 512
    limit = max_legal_row(stride)
    targets = {limit, limit + 1, limit + 2}
    calls = search_calls_by_row(make, b_values, lengths, targets)
    assert set(calls) == targets, f"search found rows {sorted(calls)} of {sorted(targets)}"
    for row, rec in sorted(calls.items()):
        got = findings(rec, "FMLA002")
        if row * stride < 2**31:
            assert got == [], (row, rec["b"])
            continue
        assert len(got) == 1, (row, rec["b"])
        _, req = reference_split_row(rec)
        assert got[0].numbers == {"request": req, "row": row, "max_row": limit, "row_stride": stride,
                                  "offset": row * stride}
        assert f"request {req}" in got[0].message


def test_fmla002_measured_boundary_shape():
    """s_q = 8, h_q = 128: 2^31 / (8*128*512) = 4096, so row 4095 is the last legal one (measured)."""
    assert max_legal_row(8 * 128 * 512) == 4095


def test_fmla002_needs_a_split_not_just_many_rows():
    """One partition (s_q = 64, h_q = 128 gives P = max(132/64/2, 1) = 1) never splits anything, so
    even 11622 rows of stride 2^22 are fine: only split requests use o_accum."""
    rec = sparse(11622, s_q=64, h_q=128, topk=2048)
    assert plan(rec).num_sm_parts == max(132 // 64 // 2, 1) == 1
    assert reference_split_row(rec) == (-1, -1)
    assert findings(rec, "FMLA002") == []


def test_fmla002_large_random_probe_b8724(oracle_probes):
    """The measured crash at b = 8724 (s_q 8, h_q 128, topk 1792 + extra 832)."""
    probe = next(p for p in oracle_probes if p["b"] == 8724)
    assert probe["verdict"] == "illegal" and "combine.cu:197" in probe["message"]
    row, req = reference_split_row(probe)
    assert row * 8 * 128 * 512 >= 2**31
    (f,) = findings(probe, "FMLA002")
    assert (f.numbers["row"], f.numbers["request"]) == (row, req)


def test_fmla002_every_probe_that_ran_stays_below_the_boundary(oracle_probes):
    """For every decode probe the kernel completed, the largest split row times s_q*h_q*512 is < 2^31."""
    n = 0
    for probe in oracle_probes:
        if probe["outcome"] != "ok" or probe.get("kind") == "prefill" or probe["b"] > 11622:
            continue
        row, _ = reference_split_row(probe)
        assert row * probe["s_q"] * probe["h_q"] * 512 < 2**31, probe["b"]
        assert findings(probe, "FMLA002") == []
        n += 1
    assert n >= 30


# ------------------------------------------------------------------------------------------------
# FMLA003 per-request lengths within [0, width]
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, width_key, width, value", [
    ("topk_length", "topk", 128, v) for v in (-1, 0, 1, 127, 128, 129, 200)
] + [
    ("extra_topk_length", "extra_topk", 64, v) for v in (-1, 0, 63, 64, 65, 100)
])
def test_fmla003_length_range(field, width_key, width, value):
    lengths = [5] * 8
    lengths[3] = value
    rec = sparse(8, topk=128)
    if field == "extra_topk_length":
        rec.update(extra_topk=width, extra_topk_length=lengths)
    else:
        rec["topk_length"] = lengths
    got = findings(rec, "FMLA003")
    if 0 <= value <= width:
        assert got == []
        return
    (f,) = got
    assert f.numbers == {"field": field, "request": 3, "value": value, "width": width, "count": 1}
    assert f"{field}[3]" in f.message


def test_fmla003_counts_every_bad_request_and_names_the_first():
    rec = sparse(8, topk=128, topk_length=[0, 128, 129, 5, -3, 400, 128, 7])
    (f,) = findings(rec, "FMLA003")
    assert f.numbers == {"field": "topk_length", "request": 2, "value": 129, "width": 128, "count": 3}
    # both fields out of range: one finding each
    rec = sparse(4, topk=128, topk_length=[200] * 4, extra_topk=64, extra_topk_length=[65] * 4)
    assert sorted(f.numbers["field"] for f in findings(rec, "FMLA003")) == ["extra_topk_length", "topk_length"]


# ------------------------------------------------------------------------------------------------
# FMLA004 topk % 64 == 0 (SM100 head64 also extra_topk)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("topk", [63, 64, 65, 100, 127, 128, 129, 2048])
def test_fmla004_topk_alignment(topk):
    got = findings(sparse(8, topk=topk), "FMLA004")
    if topk % 64 == 0:
        assert got == []
        return
    (f,) = got
    assert f.numbers == {"field": "topk", "value": topk, "multiple": 64}
    assert str(-(-topk // 64) * 64) in f.fix


@pytest.mark.parametrize("gpu, h_q, extra, flagged", [
    ("B200", 64, 63, True), ("B200", 64, 64, False), ("B200", 64, 65, True), ("B200", 64, 100, True),
    ("B200", 128, 100, False),        # head128 does not check extra_topk (source)
    ("H200", 64, 100, False),         # measured: SM90 accepted extra_topk = 100
])
def test_fmla004_extra_topk_alignment(gpu, h_q, extra, flagged):
    got = findings(sparse(8, h_q=h_q, topk=128, extra_topk=extra), "FMLA004", gpu)
    if not flagged:
        assert got == []
        return
    (f,) = got
    assert f.numbers == {"field": "extra_topk", "value": extra, "multiple": 64}


# ------------------------------------------------------------------------------------------------
# FMLA005 sparse shapes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("h_q", [32, 63, 64, 65, 96, 127, 128, 129, 256])
def test_fmla005_heads(h_q):
    got = findings(sparse(8, h_q=h_q), "FMLA005")
    if h_q in (64, 128):
        assert got == []
        return
    (f,) = got
    assert f.numbers == {"field": "h_q", "value": h_q, "allowed": [64, 128]}
    assert f.failure.startswith("process_crash")


@pytest.mark.parametrize("field, value, ok", [
    ("d_qk", 448, False), ("d_qk", 511, False), ("d_qk", 512, True), ("d_qk", 513, False),
    ("d_qk", 575, False), ("d_qk", 576, True), ("d_qk", 577, False),
    ("h_k", 1, True), ("h_k", 2, False), ("d_v", 511, False), ("d_v", 512, True), ("d_v", 513, False),
])
def test_fmla005_other_dims(field, value, ok):
    got = [f for f in findings(sparse(8, **{field: value}), "FMLA005") if f.numbers["field"] == field]
    if ok:
        assert got == []
    else:
        (f,) = got
        assert f.numbers["value"] == value


def test_fmla005_matches_the_measured_crashes(oracle_probes):
    """h_q 32 and 96 crashed the process; d_qk 448 raised a Python exception (recoverable)."""
    for probe in oracle_probes:
        if probe["kind"] != "sparse" or (probe["h_q"] in (64, 128) and probe["d_qk"] in (512, 576)):
            continue
        (f,) = findings(probe, "FMLA005")
        cls = f.failure.split(":")[0]
        assert cls == probe["outcome"], (probe["h_q"], probe["d_qk"])


# ------------------------------------------------------------------------------------------------
# FMLA006 V3.2 layout on SM90
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu, d_qk, extra_fields, flagged", [
    ("H200", 576, {"topk_length": [3] * 8}, ["topk_length"]),
    ("H200", 576, {"extra_topk": 64}, ["extra_topk"]),
    ("H200", 576, {"topk_length": [3] * 8, "extra_topk": 64}, ["extra_topk", "topk_length"]),
    ("H200", 576, {}, []),
    ("H200", 512, {"topk_length": [3] * 8, "extra_topk": 64}, []),
    ("B200", 576, {"topk_length": [3] * 8}, []),
])
def test_fmla006_v32_layout(gpu, d_qk, extra_fields, flagged):
    got = findings(sparse(8, d_qk=d_qk, topk=512, **extra_fields), "FMLA006", gpu)
    assert sorted(f.numbers["field"] for f in got) == flagged
    for f in got:
        assert f.numbers["d_qk"] == 576


# ------------------------------------------------------------------------------------------------
# FMLA007 KV layout
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d_qk, bpt", [(d, d_bpt + delta) for d, d_bpt in ((512, 584), (576, 656)) for delta in (-1, 0, 1)])
def test_fmla007_bytes_per_token(d_qk, bpt):
    want = {512: 584, 576: 656}[d_qk]        # MODEL1 584 B/token, V3.2 656 B/token
    got = findings(sparse(8, d_qk=d_qk, topk=512, bytes_per_token=bpt), "FMLA007")
    if bpt == want:
        assert got == []
    else:
        (f,) = got
        assert f.numbers == {"field": "bytes_per_token", "expected": want, "got": bpt}


@pytest.mark.parametrize("d_qk, mult", [(512, 576), (576, 656)])
@pytest.mark.parametrize("k_delta", [(3, -1), (3, 0), (3, 1)])
def test_fmla007_sm100_block_stride(d_qk, mult, k_delta):
    k, delta = k_delta
    stride = k * mult + delta
    rec = sparse(8, h_q=64, d_qk=d_qk, topk=512, kv_stride=stride)
    got = [f for f in findings(rec, "FMLA007", "B200") if f.numbers["field"] == "kv_stride"]
    assert (got != []) == (stride % mult != 0)
    if got:
        assert got[0].numbers == {"field": "kv_stride", "multiple": mult, "got": stride}
    # SM90 does not check the block stride
    assert findings(rec, "FMLA007", "H200") == []


@pytest.mark.parametrize("align", [8, 15, 16, 17, 32])
def test_fmla007_sm100_base_alignment(align):
    got = findings(sparse(8, kv_base_align=align), "FMLA007", "B200")
    assert (got != []) == (align % 16 != 0)


# ------------------------------------------------------------------------------------------------
# FMLA008 num_sm_parts <= 160
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_sms", [159, 160, 161, 264])
@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_fmla008_combine_parts_sm90(num_sms, kind):
    # sparse SM90: max(num_sms / s_q / (h_q/64), 1) = num_sms at s_q 1, h_q 64;
    # dense SM90: max(num_sms / h_k / ceil(s_q*h_q/h_k / 64), 1) = num_sms at s_q 1, h_q 64, h_k 1.
    rec = sparse(8) if kind == "sparse" else dense(8)
    gpu = raw_gpu(num_sms=num_sms)
    assert plan(rec, gpu).num_sm_parts == num_sms
    got = findings(rec, "FMLA008", gpu)
    if num_sms <= 160:
        assert got == []
    else:
        (f,) = got
        assert f.numbers == {"num_sm_parts": num_sms, "max": 160}


@pytest.mark.parametrize("num_sms, s_q, h_q, parts", [
    (320, 2, 64, 320 // 2), (322, 2, 64, 322 // 2),           # head64: num_sms / s_q
    (640, 2, 128, 640 // 2 // 2), (648, 2, 128, 648 // 2 // 2),  # head128 (d_qk 512): num_sms / s_q / 2
])
def test_fmla008_combine_parts_sm100(num_sms, s_q, h_q, parts):
    gpu = raw_gpu(num_sms=num_sms, cc=(10, 0))
    rec = sparse(8, s_q=s_q, h_q=h_q)
    assert plan(rec, gpu).num_sm_parts == parts
    got = findings(rec, "FMLA008", gpu)
    assert [f.numbers["num_sm_parts"] for f in got] == ([parts] if parts > 160 else [])


# ------------------------------------------------------------------------------------------------
# FMLA009 int32 strides
# ------------------------------------------------------------------------------------------------
def expected_strides(rec: dict) -> dict:
    """The strides the kernel passes as int32, from the shapes (FMLA009's list)."""
    s_q, h_q = rec["s_q"], rec["h_q"]
    d_qk = rec.get("d_qk", 576)
    out = {"q": s_q * h_q * d_qk, "o_accum": s_q * h_q * 512}
    if rec["kind"] == "sparse":
        out["indices"] = s_q * rec["topk"]
        if rec.get("extra_topk") is not None:
            out["extra_indices"] = s_q * rec["extra_topk"]
        bpt = rec.get("bytes_per_token") or {576: 656, 512: 584}[d_qk]
        out["kv"] = rec.get("page", 64) * bpt
    return out


# 2^31 - 1 is prime, so no product of shape fields equals it: each row puts a stride just below
# 2^31, at 2^31, or just above.
FMLA009_CASES = [
    sparse(1, s_q=65535, h_q=64, topk=128),                 # q = o_accum = 65535 * 2^15 < 2^31
    sparse(1, s_q=65536, h_q=64, topk=128),                 # q = o_accum = 2^31
    sparse(1, s_q=16384, topk=131008),                      # indices 2^31 - 2^20
    sparse(1, s_q=16384, topk=131072),                      # indices 2^31
    sparse(1, s_q=16384, topk=131136),                      # indices 2^31 + 2^20
    sparse(1, s_q=16384, extra_topk=131071),                # extra indices 2^31 - 2^14
    sparse(1, s_q=16384, extra_topk=131072),
    sparse(1, s_q=16384, extra_topk=131073),
    sparse(1, page=32768, bytes_per_token=65535),           # kv 2^31 - 2^15
    sparse(1, page=32768, bytes_per_token=65536),           # kv 2^31
    sparse(1, page=32769, bytes_per_token=65535),           # kv 2^31 + 2^15 - 1
    sparse(1, s_q=32768, h_q=128, d_qk=448, bytes_per_token=584),  # o_accum alone 2^31 (q = 448 * 2^22)
    dense(1, 1, s_q=29127, h_q=128),                        # q = 29127 * 128 * 576 = 2^31 - 8192
    dense(1, 1, s_q=29128, h_q=128),                        # q = 2^31 + 65536
]


@pytest.mark.parametrize("rec", FMLA009_CASES, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()
                                                                   if k not in ("kind", "seqlens", "b")))
def test_fmla009_int32_strides(rec):
    strides = expected_strides(rec)
    over = sorted(v for v in strides.values() if v > INT32_MAX)
    assert max(strides.values()) >= 2**31 - 2**20           # every case sits at the boundary
    got = findings(rec, "FMLA009")
    assert sorted(f.numbers["value"] for f in got) == over
    for f in got:
        assert f.numbers["max"] == INT32_MAX
        name = f.numbers["stride"].split(".")[0]
        assert strides[name] == f.numbers["value"]


# ------------------------------------------------------------------------------------------------
# FMLA010 workspace: (b + P) * s_q * h_q * 4 * (1 + 512) bytes
# ------------------------------------------------------------------------------------------------
def workspace_bytes(b: int, parts: int, s_q: int, h_q: int) -> int:
    lse = (b + parts) * s_q * h_q * 4
    o_acc = (b + parts) * s_q * h_q * 512 * 4
    return lse + o_acc


WS = workspace_bytes(100, 132, 1, 64)     # b=100 on 132 partitions (sparse, s_q 1, h_q 64)


@pytest.mark.parametrize("mem, severity", [
    (WS - 1, "warning"), (WS, "info"), (WS + 1, "info"),
    (10 * WS - 1, "info"), (10 * WS, None), (10 * WS + 10, None),
])
def test_fmla010_workspace(mem, severity):
    rec = sparse(100)
    gpu = raw_gpu(memory_bytes=mem)
    got = findings(rec, "FMLA010", gpu)
    if severity is None:
        assert got == []
        return
    (f,) = got
    assert f.severity == severity
    assert f.numbers["workspace_bytes"] == WS
    if severity == "warning":
        assert f.numbers["gpu_memory_bytes"] == mem
    # a warning never makes the call illegal
    assert report_for(rec, gpu).legal


def test_fmla010_h200_huge_workspace_is_a_warning_not_an_error():
    rec = sparse(11622, s_q=64, h_q=128, topk=512)          # P = 1
    need = workspace_bytes(11622, 1, 64, 128)
    assert need > 141_000_000_000
    (f,) = findings(rec, "FMLA010")
    assert f.severity == "warning" and f.numbers["workspace_bytes"] == need
    assert report_for(rec).legal


def test_fmla010_unknown_memory_is_silent():
    assert findings(sparse(11622, s_q=64, h_q=128), "FMLA010", raw_gpu()) == []


# ------------------------------------------------------------------------------------------------
# FMLA011 dense envelope
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", [32, 63, 64, 65, 128])
def test_fmla011_dense_page(page):
    got = findings(dense(4, page=page), "FMLA011")
    if page == 64:
        assert got == []
    else:
        (f,) = got
        assert f.numbers == {"field": "page", "expected": 64, "got": page}


@pytest.mark.parametrize("gpu, cc", [("B200", [10, 0]), (raw_gpu(cc=(8, 0)), [8, 0]), (raw_gpu(cc=(9, 0)), None)])
def test_fmla011_dense_arch(gpu, cc):
    got = findings(dense(4), "FMLA011", gpu)
    assert [f.numbers["cc"] for f in got] == ([cc] if cc else [])
    assert findings(sparse(4), "FMLA011", gpu) == []         # sparse calls are not its business


# ------------------------------------------------------------------------------------------------
# FMLA012 sparse needs fp8 and causal=False
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("is_fp8, causal, flagged", [
    (True, False, []), (False, False, ["is_fp8"]), (True, True, ["causal"]), (False, True, ["causal", "is_fp8"]),
])
def test_fmla012_sparse_requirements(is_fp8, causal, flagged):
    got = findings(sparse(4, is_fp8=is_fp8, causal=causal), "FMLA012")
    assert sorted(f.numbers["field"] for f in got) == flagged
    # dense calls may be causal and bf16
    assert findings(dense(4, is_fp8=False, causal=True), "FMLA012") == []


# ------------------------------------------------------------------------------------------------
# FMLA013 an implementation exists
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu, rec, flagged", [
    ("H200", sparse(4, h_q=96), False),                       # SM90 dispatches; FMLA005 says it
    ("B200", sparse(4, h_q=96), True),                        # no SM100 head count 96
    ("B200", sparse(4, h_q=64), False),                       # head64
    ("B200", sparse(4, h_q=128, d_qk=576, topk=512), False),  # head64x2
    ("B200", sparse(4, h_q=128, d_qk=512), False),            # head128
    ("B200", sparse(4, h_q=128, d_qk=448), True),
    (raw_gpu(cc=(8, 0)), sparse(4), True),                    # sm80: no decode kernel
    (raw_gpu(cc=(8, 0)), dense(4), False),                    # FMLA011 says it
])
def test_fmla013_implementation_exists(gpu, rec, flagged):
    got = findings(rec, "FMLA013", gpu)
    assert (got != []) == flagged
    if flagged:
        assert got[0].numbers["h_q"] == rec["h_q"] and got[0].numbers["d_qk"] == rec["d_qk"]


# ------------------------------------------------------------------------------------------------
# FMLA014 sparse prefill needs s_q >= 1 (and has no row limit)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s_q", [0, 1, 2, 11622, 11623, 200000])
def test_fmla014_sparse_prefill_rows(s_q):
    rec = {"kind": "prefill", "s_q": s_q, "h_q": 64, "d_qk": 512, "topk": 512}
    report = report_for(rec)
    if s_q == 0:
        (f,) = report.findings
        assert f.code == "FMLA014" and f.numbers == {"s_q": 0, "min": 1}
    else:
        assert report.findings == []              # in particular no FMLA001 above 11622 rows
