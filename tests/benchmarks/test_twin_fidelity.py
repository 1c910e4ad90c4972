"""The fidelity benchmark's own behaviour (its figures are never asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("twin_fidelity",
                                                      BENCHMARKS / "twin_fidelity.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # Registered first, as importlib's recipe does: a dataclass in the module looks
        # its module up while it is built.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_each_class_gets_enough_requests_for_its_p99_by_default() -> None:
    tf = _load()
    # P0 and P2 are 20 % each: at least 30 requests, so numpy's interpolated p99 lies
    # between the two slowest rather than on one request (60 requests gave 9-11).
    share = min(tf.CLASSES.weights) / sum(tf.CLASSES.weights)
    assert tf.REQUESTS * share >= 30 and tf.QUICK_REQUESTS * share >= 16
    assert "percentile" in (tf.__doc__ or "") and "type 7" in (tf.__doc__ or "")


def test_too_few_requests_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.profiles import profile_file

    tf = _load()
    path = profile_file(tmp_path, model="tiny-random", device="cpu")
    monkeypatch.setattr(sys, "argv", ["twin_fidelity.py", "--profile", str(path),
                                      "--requests", "5"])
    with pytest.raises(SystemExit, match=r"--requests 5: expected at least 10"):
        tf.main()


def test_repeat_real_names_the_loads_and_refuses_others() -> None:
    tf = _load()
    assert tf.repeat_loads("") == []
    assert tf.repeat_loads("over, near") == [1, 2]
    assert tf.repeat_loads("all") == [0, 1, 2]
    with pytest.raises(SystemExit, match=r"unknown load 'saturated'; use light, near, over"):
        tf.repeat_loads("near,saturated")


def test_a_runs_json_gives_back_its_reports_for_a_replot(tmp_path: Path) -> None:
    import dataclasses
    import json

    from tests.engine.calibrate.test_replay import _run

    tf = _load()
    report, _, _ = _run(1.25)
    doc = json.loads(json.dumps({"loads": [dataclasses.asdict(report)],
                                 "corrected": {"loads": [dataclasses.asdict(report)]},
                                 "real_repeat": []}, default=str))
    loads, live, again = tf.reports_from_json(doc)
    assert again == [] and len(loads) == len(live) == 1
    back = loads[0]
    assert {k: (c.measured, c.predicted) for k, c in back.classes.items()} == {
        k: (c.measured, c.predicted) for k, c in report.classes.items()}
    assert back.worst_error() == report.worst_error()
    assert back.iterations.mape == report.iterations.mape
    subject = tf.subject_from_json(doc, tmp_path / "run.json")
    tf.plot(loads, _profile(), tmp_path / "p.png", corrected=live, again=loads,
            subject=subject)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_plot_names_the_workload_the_twin_and_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PNG read alone said which profile and device, but not which requests it served
    nor which run it was: the subject goes under the title, and into --json, so that a
    --replot draws it again."""
    import dataclasses
    import json

    from tests.engine.calibrate.test_replay import _run

    tf = _load()
    report = _run(1.25)[0]
    monkeypatch.setattr(sys, "argv", ["twin_fidelity.py", "--profile",
                                      str(tmp_path / "smollm2-cpu.yaml"), "--seed", "3"])
    args = tf.parse_args()
    profile = _profile()
    subject = tf.run_subject(args, profile, 150, 128.0, 32.0)
    fig = sys.modules["twin_fidelity_report"].figure([report], profile, subject=subject)
    title = fig._suptitle.get_text().replace("\n    ", " ")
    assert title.startswith("Twin fidelity: tiny-random on a test cpu on Test Device 1")
    assert ("workload: trace azure-llm-2023-conv, requests 0-149, prompts scaled to mean "
            "128 tokens and outputs to 32") in title
    assert "twin: tiny-random on calibrated profile smollm2-cpu.yaml (Test Device 1)" in title
    assert "run: benchmarks/twin_fidelity.py --seed 3 " in title
    assert str(tmp_path) not in title  # file names only: the PNG leaves this machine
    doc = json.loads(json.dumps({"subject": dataclasses.asdict(subject)}))
    assert tf.subject_from_json(doc, tmp_path / "run.json") == subject
    older = tf.subject_from_json({}, tmp_path / "run.json")
    assert "not recorded" in older.workload and "--replot run.json" in older.run


def _profile() -> object:
    from tests.support.profiles import make_profile

    return make_profile("tiny-random", device="cpu")


def test_the_load_order_names_each_load_once() -> None:
    tf = _load()
    assert tf.load_order("light,near,over") == [0, 1, 2]
    assert tf.load_order(" over, near ,light") == [2, 1, 0]
    with pytest.raises(SystemExit, match=r"unknown load 'heavy'; use light, near, over"):
        tf.load_order("light,heavy,over")
    for text in ("light,near", "light,near,near", "light,near,over,light", ""):
        with pytest.raises(SystemExit, match="name each of light, near, over once"):
            tf.load_order(text)


def test_a_users_trace_is_drawn_from_instead_of_the_shipped_one(tmp_path: Path) -> None:
    from slopilot.engine.sim.profile_file import load_profile
    from tests.support.profiles import profile_file

    tf = _load()
    profile = load_profile(profile_file(tmp_path, model="tiny-random", device="cpu"))
    trace = tmp_path / "code_1week.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2024-05-10 00:00:{i:02d}.5+00:00,{100 * (i + 1)},{i + 1}\n" for i in range(12)))
    specs = tf.workload(profile, 10, 64.0, 16.0, 2, 0, str(trace))
    # Its arrivals (from the third row) and its lengths' shape, scaled to the means.
    assert [s.arrival_time for s in specs] == [float(i) for i in range(10)]
    prompts = [len(s.prompt_token_ids) for s in specs]
    assert prompts == sorted(prompts) and prompts[0] < prompts[-1]
    with pytest.raises(SystemExit, match="too few requests"):
        tf.workload(profile, 11, 64.0, 16.0, 2, 0, str(trace))
