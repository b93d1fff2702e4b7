"""fused_logits' kernels compiled offline for sm_90 (Triton's CUDA backend, no GPU needed): the interpreter
runs a kernel's arithmetic but not the compiler's checks (a tensor must keep its shape and type across
branches, constexpr-only arguments), which a GPU run would be the first to see."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sdbench.ops.prob_verify.triton_kernels import INTERPRETED  # noqa: E402

pytestmark = pytest.mark.skipif(INTERPRETED, reason="TRITON_INTERPRET=1 replaces the kernels with interpreted functions")

POINTER_TYPES = {  # the dtypes fused_logits_launcher passes (logits: bf16 here); any other *_ptr is float32
    "target_ptr": "*bf16", "draft_ptr": "*bf16", "draft_tokens_ptr": "*i64", "stats_arg_ptr": "*i32",
    "row_arg_ptr": "*i32", "arrivals_ptr": "*i32", "accepted_lengths_ptr": "*i64", "next_tokens_ptr": "*i64",
    "output_tokens_ptr": "*i64", "error_flags_ptr": "*i32", "best_ptr": "*i64", "offsets_ptr": "*i64",
    "stop_ptr": "*i32", "sequence_arrivals_ptr": "*i32", "chunk_mass_ptr": "*fp32", "chunk_pick_ptr": "*i32",
    "stop_stats_ptr": "*fp32", "done_ptr": "*i32", "timeline_ptr": "*i64",
}
SCALARS = {"seed": "i64"}  # every other scalar argument: i32


def _compile(fn, constexprs: dict, aligned: bool = False, divisible: tuple[str, ...] = ()):
    """aligned: every pointer marked 16-byte aligned, as Triton marks a launch's torch tensors (the integers are
    left unmarked, as a count that is not a multiple of 16 is, except those named in `divisible`)."""
    signature, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = POINTER_TYPES.get(name, "*fp32")
            if aligned:
                attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = SCALARS.get(name, "i32")
            if name in divisible:
                attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, attrs=attrs,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    try:
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except Exception as err:  # a missing toolchain is a skip; a compile error in the kernel is a failure
        if "ptxas" in str(err) and "error" not in str(err).lower():
            pytest.skip(f"Triton's CUDA toolchain is not usable here: {err}")
        raise


def _kernels():
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels

    return kernels


@pytest.mark.parametrize("combine,scan,timeline", [(True, True, False), (True, False, False), (False, False, False),
                                                   (False, False, True)])  # timeline: the diagnostic build (`_mark`)
@pytest.mark.parametrize("fast", [True, False])
# float32 and bfloat16 logits (16 bytes a lane); bf16 also read as 32-bit words (`_load_tile`; float32 never is)
@pytest.mark.parametrize("vec,words", [(4, False), (8, False), (8, True)])
@pytest.mark.parametrize("pdl", [True, False])  # programmatic dependent launch: pass 1 lets the next kernel start
@pytest.mark.parametrize("skip", [True, False])  # greedy requests' draft rows not read (the token rule)
def test_row_stats_kernel_compiles_for_sm90(combine, scan, timeline, fast, vec, words, pdl, skip, read_first=False,
                                            sequence_done=False):
    kernels = _kernels()
    constexprs = {"GAMMA": 8, "TILE": 1024, "COMBINE": combine, "SPLITS_PAD": 4, "SCAN": scan, "GAMMA_PAD": 8,
                  "R_PAD": 32, "PRECISE_MATH": True, "FAST": fast, "VEC": vec, "FTZ_EXP2": True, "TIMELINE": timeline,
                  "PDL": pdl, "SKIP_GREEDY_DRAFTS": skip, "WORDS": words, "READ_FIRST": read_first,
                  "BATCH_PAD": 32 if read_first else 1, "SEQUENCE_DONE": sequence_done}
    ptx = _compile(kernels._row_stats_kernel, constexprs).asm["ptx"]
    assert "_row_stats_kernel" in ptx and ("%globaltimer" in ptx) == timeline
    assert ("griddepcontrol.launch_dependents" in ptx) == pdl and "griddepcontrol.wait" not in ptx
    # SEQUENCE_DONE (scan "early"): one release arrival a program on its sequence's count, and nothing else atomic
    # where pass 1 neither combines nor scans
    if not (combine or scan):
        assert bool(re.search(r"(atom|red)\.global\.gpu\.release\.add", ptx)) == sequence_done
        assert len(re.findall(r"\b(atom|red)\.", ptx)) == sequence_done
    if sequence_done:  # the barrier between every thread's stores of the partial and the one release (`_count_done`)
        release = re.search(r"(atom|red)\.global\.gpu\.release\.add", ptx).start()
        last_store = ptx.rfind("st.global", 0, release)
        assert 0 <= last_store < ptx.rfind("bar.sync", 0, release)


@pytest.mark.parametrize("timeline", [False, True])
@pytest.mark.parametrize("vec,words", [(4, False), (8, True)])
@pytest.mark.parametrize("pdl", [True, False])
def test_row_stats_kernel_compiles_counting_its_sequence_done(timeline, vec, words, pdl):
    """SEQUENCE_DONE (scan "early": programs launched sequence by sequence, each counting itself done)."""
    test_row_stats_kernel_compiles_for_sm90(False, False, timeline, True, vec, words, pdl, True, sequence_done=True)


@pytest.mark.parametrize("combine,timeline", [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("vec,words", [(4, False), (8, True)])
def test_row_stats_kernel_compiles_with_the_reading_programs_first(combine, timeline, vec, words):
    """READ_FIRST (`_read_first`, fused_logits_launcher's read_first option; the token rule's skip)."""
    test_row_stats_kernel_compiles_for_sm90(combine, False, timeline, True, vec, words, True, True, read_first=True)


def test_bf16_words_widen_without_a_conversion():
    """WORDS: pass 1's whole bf16 tiles are widened by a shift and a mask (`_load_tile`); only the masked last tile
    converts (cvt.f32.bf16), so half the conversions of the element path remain (the kernel holds one whole-tile and
    one tail copy of a tile's fold); the same 16-byte loads either way."""
    kernels = _kernels()
    constexprs = {"GAMMA": 4, "TILE": 2048, "COMBINE": False, "SPLITS_PAD": 16, "SCAN": False, "GAMMA_PAD": 4,
                  "R_PAD": 16, "PRECISE_MATH": True, "FAST": True, "VEC": 8, "FTZ_EXP2": True, "TIMELINE": False,
                  "PDL": True, "SKIP_GREEDY_DRAFTS": True, "WORDS": True, "READ_FIRST": False, "BATCH_PAD": 1}
    # (a launch's row strides, span and vocabulary, multiples of 16 on the grid: so the whole tiles load 16 bytes a lane)
    divisible = ("vocab", "span", "stride_p_b", "stride_p_row", "stride_q_b", "stride_q_row")
    ptx = _compile(kernels._row_stats_kernel, constexprs, aligned=True, divisible=divisible).asm["ptx"]
    plain = _compile(kernels._row_stats_kernel, {**constexprs, "WORDS": False}, aligned=True,
                     divisible=divisible).asm["ptx"]
    assert ptx.count("ld.global.v4.b32") == plain.count("ld.global.v4.b32") > 0
    conversions = ptx.count("cvt.f32.bf16")
    assert conversions == plain.count("cvt.f32.bf16") // 2 and ptx.count("-65536;") == conversions // 2
    assert "-65536;" not in plain
    # join and reshape put the halves in column order within each thread: no layout conversion through shared memory
    assert ptx.count("st.shared") == plain.count("st.shared")


@pytest.mark.parametrize("rule,scan", [("token", "race"), ("token", "early"), ("token", "pass1"), ("token", "kernel"),
                                       ("block", "race")])
# fast mode: by inversion (cdf; picks: each program's candidate in its chunks), or the race
@pytest.mark.parametrize("fast,cdf,picks", [(True, True, False), (True, True, True), (True, False, False),
                                            (False, False, False)])
@pytest.mark.parametrize("steps,vec", [(1, 8), (3, 4)])  # the inversion's lanes: bfloat16, float32
@pytest.mark.parametrize("timeline", [False, True])  # the diagnostic build (`_mark`)
# pdl: launched with launch_pdl, it waits for the kernel ahead; tokens_first: a race that scans loads the tokens first
@pytest.mark.parametrize("pdl,tokens_first", [(True, True), (True, False), (False, False), (False, True)])
def test_race_kernel_compiles_for_sm90(rule, scan, fast, cdf, picks, steps, vec, timeline, pdl, tokens_first,
                                       lean=True, compile_=True):
    kernels = _kernels()
    pads = dict(GAMMA=8, GAMMA_PAD=8, R_PAD=32, MASS_PAD=4, ROWS=256, STEPS=steps, PRECISE_MATH=True,
                FAST=fast, RULE=rule, SCANNED=scan not in ("race", "early"), CDF=cdf, CHUNKS_PAD=256, STATS_PAD=4,
                STOP_STATS=scan == "kernel", VEC=vec, TIMELINE=timeline, PDL=pdl, TOKENS_FIRST=tokens_first,
                LEAN_SCAN=lean, PICKS=16 // vec if picks else 0,  # picks' units of 2 (bf16) or 4 (fp32) lanes
                SEQUENCE_WAIT=scan == "early")
    ptx = _compile(kernels._logits_race_kernel, pads).asm["ptx"]
    if not compile_:
        return ptx
    assert "_logits_race_kernel" in ptx and ("%globaltimer" in ptx) == timeline
    # scan "early" waits on its own sequence's count (acquire), never for the whole kernel ahead
    assert ("griddepcontrol.wait" in ptx) == (pdl and scan != "early")
    assert "griddepcontrol.launch_dependents" not in ptx
    # (an atomic add of 0 with acquire: Triton 3.9 emits an acquire load, by one thread, shared through a barrier)
    assert bool(re.search(r"(atom|ld)\.global\.gpu\.acquire", ptx)) == (scan == "early")
    if scan == "early":  # the partials another program wrote in the kernel ahead, which may still run: from L2
        # (the last arrival's draw reads the chunk masses with .cg in every scan: count against scan "race")
        plain = test_race_kernel_compiles_for_sm90(rule, "race", fast, cdf, picks, steps, vec, timeline, pdl,
                                                   tokens_first, lean, compile_=False)
        assert ptx.count("ld.global.cg") > plain.count("ld.global.cg")


@pytest.mark.parametrize("fast,cdf", [(True, True), (False, False)])
@pytest.mark.parametrize("steps,vec", [(1, 8), (3, 4)])
@pytest.mark.parametrize("pdl,tokens_first", [(True, True), (False, False)])
@pytest.mark.parametrize("scan", ["race", "early"])
def test_race_kernel_compiles_with_every_row_combined(fast, cdf, steps, vec, pdl, tokens_first, scan):
    """lean_scan=False (the race that scans combines all 2γ+1 rows, then picks: the A/B's other side)."""
    test_race_kernel_compiles_for_sm90("token", scan, fast, cdf, False, steps, vec, False, pdl, tokens_first,
                                       lean=False)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("flags,pdl", [(True, True), (True, False), (False, False)])  # the peer: no flag, no PDL
@pytest.mark.parametrize("lean", [True, False])  # only the rows it reads, each combined alone; or all, then picks
def test_scan_kernel_compiles_for_sm90(fast, flags, pdl, lean):
    kernels = _kernels()
    pads = dict(GAMMA=8, GAMMA_PAD=8, R_PAD=32, SPLITS_PAD=16, PRECISE_MATH=True, FAST=fast, FLAGS=flags, PDL=pdl,
                LEAN_SCAN=lean)
    ptx = _compile(kernels._scan_kernel, pads).asm["ptx"]
    assert "_scan_kernel" in ptx
    assert ("griddepcontrol.wait" in ptx) == pdl and ("griddepcontrol.launch_dependents" in ptx) == pdl


def test_partials_load_as_vectors_at_any_split_count():
    """Each row's partials lie SPLITS_PAD apart (`partials_stride`), so the scan kernel's loads of them are 16-byte
    vectors even where `splits` (a runtime integer, here unmarked: 30 partials a row) is not a multiple of 16. With
    the stride `splits` and a `parts < splits` mask they were scalar: 42 global loads, none a vector, at this point
    (γ = 16, SPLITS_PAD = 32), against 15 with 6 vectors now."""
    kernels = _kernels()
    pads = dict(GAMMA=16, GAMMA_PAD=16, R_PAD=64, SPLITS_PAD=32, PRECISE_MATH=True, FAST=True, FLAGS=True, PDL=False,
                LEAN_SCAN=True)
    ptx = _compile(kernels._scan_kernel, pads, aligned=True).asm["ptx"]
    assert "ld.global.v4" in ptx


def test_block_mass_kernel_compiles_for_sm90():
    kernels = _kernels()
    pads = dict(GAMMA=8, GAMMA_PAD=8, R_PAD=32, SPLITS_PAD=1, TILE=2048, PRECISE_MATH=True)
    assert "_block_mass_kernel" in _compile(kernels._block_mass_kernel, pads).asm["ptx"]


@pytest.mark.parametrize("fast,cdf", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("vec,race_vec,steps", [(8, 8, 1), (4, 4, 3)])  # bfloat16, float32
def test_one_launch_kernel_compiles_for_sm90(fast, cdf, vec, race_vec, steps):
    kernels = _kernels()
    # TILE: `stats_tile`, 4 KiB of logits a step (bf16 2048 columns, float32 1024)
    pads = dict(GAMMA=8, GAMMA_PAD=8, R_PAD=32, TILE=256 * vec, VEC=vec, ROWS=256, STEPS=steps, RACE_VEC=race_vec,
                PRECISE_MATH=True, FAST=fast, CDF=cdf, CHUNKS_PAD=256, STATS_PAD=4)
    assert "_one_launch_kernel" in _compile(kernels._one_launch_kernel, pads).asm["ptx"]
