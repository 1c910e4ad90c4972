"""How long deleting a big study holds a shared SQLite file, and whether another
study's tell in the same file gets through meanwhile.

Every CR that names no storage writes into one SQLite file; a CR's study is deleted
with it (``storage.delete_named_study``). This script writes a victim study and a 50-trial
seed study through ``Tuner`` (the controller's ask and tell), clones the seed's rows by
SQL into a study of ``--trials`` trials, and deletes that one while:

- a probe connection with no busy wait tries ``BEGIN IMMEDIATE`` and a read every 20 ms:
  the longest span it found the file write-locked, and read-blocked;
- the victim's ``tell`` starts once the probe has found the file write-locked for
  ``--tell-after`` seconds on end (``tell=no_window`` where it never was).

    .venv/bin/python benchmarks/study_delete_lock.py [--trials 10000] [--tell-after 0.3]

Ends with ``RESULT trials=... delete_s=... write_lock_s=... read_block_s=...
tell_s=... tell=ok|<error>``. Run it against an older checkout by ``PYTHONPATH``: it
uses only ``storage``'s functions and ``Tuner``.
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import delete_named_study, open_study
from slopilot.tuner.study.tuner import Tuner

_CHILDREN = (("trial_params", "param_name,param_value,distribution_json"),
             ("trial_values", "objective,value,value_type"),
             ("trial_user_attributes", "key,value_json"),
             ("trial_system_attributes", "key,value_json"),
             ("trial_heartbeats", "heartbeat"))


def _result(config: dict[str, object]) -> TrialResult:
    return TrialResult(config=config, goodput_tok_s=10.0, constraints=(-0.5,),
                       feasible=True, constraint_names=("p0_ttft",))


def _write(url: str, name: str, n: int) -> None:
    tuner = Tuner(open_study(url, name), SearchSpace.from_bounds())
    for _ in range(n):
        number, config = tuner.ask()
        tuner.tell(number, _result(config))
    tuner.close()


def _clone(db: Path, seed: str, big: str, n: int) -> None:
    con = sqlite3.connect(db)
    cur = con.cursor()
    seed_id = cur.execute("select study_id from studies where study_name=?",
                          (seed,)).fetchone()[0]
    cur.execute("insert into studies(study_name) values (?)", (big,))
    big_id = cur.lastrowid
    cur.execute("insert into study_directions(direction,study_id,objective) select "
                "direction,?,objective from study_directions where study_id=?",
                (big_id, seed_id))
    rows = [r[0] for r in cur.execute("select trial_id from trials where study_id=?",
                                      (seed_id,))]
    for number in range(n):
        source = rows[number % len(rows)]
        cur.execute("insert into trials(number,study_id,state,datetime_start,"
                    "datetime_complete) select ?,?,state,datetime_start,datetime_complete "
                    "from trials where trial_id=?", (number, big_id, source))
        new = cur.lastrowid
        for table, cols in _CHILDREN:
            cur.execute(f"insert into {table}(trial_id,{cols}) select ?,{cols} from {table} "
                        "where trial_id=?", (new, source))
    con.commit()
    con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--tell-after", type=float, default=0.3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "shared.db"
        url = f"sqlite:///{db}"
        _write(url, "ns-a/victim/uid1", 30)
        _write(url, "ns-b/seed/uid", 50)
        _clone(db, "ns-b/seed/uid", "ns-b/big/uid", args.trials)
        victim = Tuner(open_study(url, "ns-a/victim/uid1"), SearchSpace.from_bounds())
        number, config = victim.ask()
        probe = sqlite3.connect(db, timeout=0, isolation_level=None,
                                check_same_thread=False)
        stop, locked = threading.Event(), threading.Event()
        spans: dict[str, list[float]] = {"write": [], "read": []}
        told: dict[str, str] = {}
        tell_s: list[float] = []

        def watch() -> None:
            since: dict[str, float | None] = {"write": None, "read": None}
            while not stop.is_set():
                for kind, sql in (("write", "BEGIN IMMEDIATE"),
                                  ("read", "select count(*) from studies")):
                    now = time.perf_counter()
                    try:
                        probe.execute(sql).fetchall()
                        if kind == "write":
                            probe.execute("ROLLBACK")
                    except sqlite3.OperationalError:
                        since[kind] = since[kind] or now
                        if kind == "write" and now - (since[kind] or now) >= args.tell_after:
                            locked.set()
                    else:
                        start = since[kind]
                        if start is not None:
                            spans[kind].append(now - start)
                        since[kind] = None
                time.sleep(0.02)

        def tell() -> None:
            locked.wait()
            if stop.is_set():
                told["tell"] = "no_window"
                return
            start = time.perf_counter()
            try:
                victim.tell(number, _result(config))
                told["tell"] = "ok"
            except Exception as exc:  # the failure measured: say it
                cause = exc.__cause__
                line = str(cause).splitlines()[0] if cause is not None else ""
                told["tell"] = f"{type(exc).__name__}({type(cause).__name__}: {line})"
            tell_s.append(time.perf_counter() - start)

        threads = [threading.Thread(target=watch), threading.Thread(target=tell)]
        for thread in threads:
            thread.start()
        start = time.perf_counter()
        delete_named_study(url, "ns-b/big/uid")
        took = time.perf_counter() - start
        time.sleep(0.3)
        stop.set()
        locked.set()
        for thread in threads:
            thread.join()
        victim.close()
    print(f"RESULT trials={args.trials} delete_s={took:.1f} "
          f"write_lock_s={max(spans['write'], default=0):.2f} "
          f"read_block_s={max(spans['read'], default=0):.2f} "
          f"tell_s={max(tell_s, default=0.0):.2f} "
          f"tell={told.get('tell', 'not_run').replace(' ', '_')}")


if __name__ == "__main__":
    main()
