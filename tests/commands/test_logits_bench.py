"""logits_bench's host-side pieces that need no GPU."""

from sdbench.commands import calibrate_tau, logits_bench


def test_the_copy_ceiling_is_the_best_of_its_runs(monkeypatch):
    """One slow run (a transient on the device) must not lower the ceiling every floor of the run reads."""
    medians_gbps = iter([2688.0, 2948.0, 2931.0])
    calls = []

    def one_run(device, n_bytes):
        calls.append((device, n_bytes))
        return next(medians_gbps)

    monkeypatch.setattr(calibrate_tau, "measure_copy_bandwidth_gbps", one_run)
    assert logits_bench.copy_ceiling_tbps("cuda") == 2.948
    assert calls == [("cuda", 2**30)] * calibrate_tau.COPY_CEILING_RUNS
