"""serial_triton parity on CPU tensors under the Triton interpreter.

triton.jit picks the interpreter at decoration time from TRITON_INTERPRET, so the kernel runs in a
subprocess started with TRITON_INTERPRET=1; this process may have imported triton without it.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

# Small shapes: the interpreter runs each program in Python. Edges: γ=1, a γ past a 32-wide warp,
# α 0 and 1 (every sequence rejects at once / accepts everything and takes the bonus token).
CHILD = textwrap.dedent("""
    import json, torch
    from sdbench import parity, registry
    from sdbench.ops.workload import VerifyConfig, make_verify_workload

    impl = registry.get("verify", "serial_triton")
    report = {"probe": impl.unavailable_reason("cpu"), "failures": [], "rows": 0}
    for batch, gamma, alpha, dist, token_dtype in [
        (1, 1, 0.0, "binomial", "int64"), (5, 1, 1.0, "geometric", "int32"), (7, 33, 0.6, "geometric", "int64"),
        (3, 8, 1.0, "binomial", "int32"), (33, 8, 0.5, "binomial", "int64"), (4, 31, 0.0, "geometric", "int32"),
    ]:
        cfg = VerifyConfig(batch, gamma, alpha, dist=dist, token_dtype=token_dtype, seed=batch * gamma)
        w = make_verify_workload(cfg, "cpu")
        failure = parity.check(impl, w)
        if failure:
            report["failures"].append(f"{cfg}: {failure}")
        run = impl.prepare(w)
        parity.poison(run.outputs)
        out = run()
        k = w.accepted_lengths
        expected = torch.full((batch, gamma + 1), -1, dtype=w.target_tokens.dtype)
        for i in range(batch):
            expected[i, : k[i]] = w.draft_tokens[i, : k[i]]
            expected[i, k[i]] = w.target_tokens[i, k[i]]
        if not torch.equal(out["output_tokens"], expected):
            report["failures"].append(f"{cfg}: output_tokens {out['output_tokens'].tolist()} != {expected.tolist()}")
        report["rows"] += batch
    print("REPORT" + json.dumps(report))
""")


def test_serial_triton_matches_the_reference_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.split("REPORT", 1)[1])
    assert report["probe"] is None
    assert report["failures"] == []
    assert report["rows"] == 53


def test_serial_triton_on_cpu_asks_for_the_interpreter():
    from sdbench import registry
    from sdbench.ops import backends

    reason = registry.get("verify", "serial_triton").unavailable_reason("cpu")
    if backends.TRITON_INTERPRETED:
        assert reason is None
    else:
        assert "TRITON_INTERPRET=1" in reason
