"""The pipeline model's executor terms (engine.perf.pipeline.Executor): the
simulator's untimed work per instruction against hand counts and the closed
form, the fit recovering known coefficients, the stage prices it yields,
and ``sprint predict --executor``."""
import json

import pytest

from engine import cli
from engine.perf import pipeline as P
from engine.perf import pipeline_sim as PS
from engine.perf.profile import Profile

PROF = Profile.synthetic()


def _equal(K, tf=1e-3, tb=2e-3, tu=3e-4, tc=0.0, tx=2e-4):
    return [P.StageCost(("x",), 1, tf, tb, tu, tc, tx) for _ in range(K)]


@pytest.mark.parametrize("M", [1, 4])
def test_one_stage_pays_the_executor_after_every_instruction(M):
    tf, tb, tu, tx = 1e-3, 2e-3, 3e-4, 2e-4
    r = PS.play(_equal(1, tf, tb, tu, tx=tx), "gpipe", M, 3 * M)
    per_minibatch = M * (tf + tx) + M * (tb + tx) + tu + tx
    assert r["makespan"] == pytest.approx(3 * per_minibatch, rel=1e-12)
    assert r["wall"][0]["X"] == pytest.approx(3 * (2 * M + 1) * tx, rel=1e-12)
    # the pass timers see only their passes
    assert r["wall"][0]["F"] == pytest.approx(3 * M * tf, rel=1e-12)
    assert r["passes"][0] == {"F": 3 * M, "B": 3 * M, "U": 3}


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipe"])
@pytest.mark.parametrize("K", [2, 4, 16])
def test_steady_state_with_executor_work_matches_the_closed_form(schedule, K):
    costs = _equal(K)
    n = 4 * K
    a = PS.play(costs, schedule, 1, n)["makespan"]
    b = PS.play(costs, schedule, 1, 2 * n)["makespan"]
    cf = PS.closed_form(costs, schedule, 1)
    assert b - a == pytest.approx(n * cf["t_minibatch"], rel=1e-9)
    # the untimed work is not free: the same stages without it run faster
    assert PS.play(_equal(K, tx=0.0), schedule, 1, n)["makespan"] < a


def test_messages_leave_when_the_pass_ends_not_after_the_executor_work():
    # two stages, one micro-batch: F0, (message), F1, B1, (message), B0;
    # stage 0's X after F0 runs while the message travels
    tf, tb, tx = 1e-3, 2e-3, 5e-4
    costs = [P.StageCost(("x",), 1, tf, tb, 0.0, 0.0, tx) for _ in range(2)]
    r = PS.play(costs, "gpipe", 1, 1)
    # F0, F1 X1 B1 | B0 X0 then U0 X0 (U1 X1 ran while B0 ran)
    assert r["makespan"] == pytest.approx(tf + (tf + tx) + tb + (tb + tx) + tx, rel=1e-12)


@pytest.mark.parametrize("per_pass,cold", [(1.5e-4, 0.2), (0.0, 0.35), (2e-4, 0.0)])
def test_fit_recovers_known_coefficients(per_pass, cold):
    kernels = [5e-5, 2e-4, 4e-4, 8e-4, 1.6e-3, 3e-3]
    copies = [0.0, 1e-5, 0.0, 3e-5, 2e-5, 0.0]
    passes = [(k, c, (1 + cold) * k + c + per_pass) for k, c in zip(kernels, copies)]
    ex = P.fit_executor(passes, [1e-4, 3e-4, 2e-4])
    assert ex.per_pass == pytest.approx(per_pass, abs=1e-12)
    assert ex.cold == pytest.approx(cold, abs=1e-9)
    assert ex.per_instruction == pytest.approx(2e-4)


def test_fit_keeps_both_terms_non_negative():
    kernels = [1e-4, 5e-4, 1e-3, 2e-3]
    # faster than the profile: no negative slowdown, the offset alone
    ex = P.fit_executor([(k, 0.0, 0.8 * k + 1e-4) for k in kernels])
    assert ex.cold == 0.0 and ex.per_pass > 0
    # a pass cheaper than per_pass would make it: no negative Python
    ex = P.fit_executor([(k, 0.0, 1.5 * k - 5e-5) for k in kernels])
    assert ex.per_pass == 0.0 and 0.2 < ex.cold < 0.5
    assert ex.per_instruction == 0.0


@pytest.mark.parametrize("schedule,mode", [("gpipe", "none"), ("1f1b", "none"), ("1f1b", "spectrain")])
def test_stage_costs_price_the_executor_terms(schedule, mode):
    ex = P.Executor(per_pass=1e-4, cold=0.25, per_instruction=3e-5)
    parts = [(0, 2), (2, 4)]
    base = P.stage_costs("digits", parts, 32, 4, PROF)
    got = P.stage_costs("digits", parts, 32, 4, PROF, executor=ex, schedule=schedule, predict_mode=mode)
    n_f, n_b = P.executor_copies(schedule, mode)
    assert n_b == 2 and n_f == {"gpipe": 1, "1f1b": 2}[schedule] + (mode == "spectrain")
    for a, b in zip(base, got):
        copy = PROF.term("copy", a.params)
        assert b.t_f == pytest.approx(1.25 * a.t_f + n_f * copy + 1e-4, rel=1e-12)
        assert b.t_b == pytest.approx(1.25 * a.t_b + n_b * copy + 1e-4, rel=1e-12)
        assert (b.t_u, b.t_c, b.t_x, a.t_x) == (a.t_u, a.t_c, 3e-5, 0.0)
    slow = P.predict("digits", stages=2, n_subbatch=32, profile=PROF, schedule=schedule, executor=ex)
    fast = P.predict("digits", stages=2, n_subbatch=32, profile=PROF, schedule=schedule)
    assert slow.throughput < fast.throughput and slow.extra["executor"]["cold"] == 0.25


def test_predict_cli_reads_the_probe_file(tmp_path, capsys):
    f = tmp_path / "ex.json"
    f.write_text(json.dumps({"executor": {"per_pass": 1e-4, "cold": 0.1, "per_instruction": 5e-5}, "runs": []}))
    prof = tmp_path / "p.json"
    PROF.save(prof)
    argv = ["predict", "--parallel", "pipeline", "--model", "digits", "--subbatch", "32", "--no-calibrate",
            "--profile", str(prof), "--stages", "2", "--json"]
    assert cli.main([*argv, "--executor", str(f)]) == 0
    got = json.loads(capsys.readouterr().out)
    want = P.predict("digits", stages=2, n_subbatch=32, profile=PROF, executor=P.Executor.load(f))
    assert got["t_minibatch"] == pytest.approx(want.t_minibatch)
    assert got["extra"]["executor"] == {"per_pass": 1e-4, "cold": 0.1, "per_instruction": 5e-5, "shared": 0.0,
                                        "conv_f": 1.0, "conv_b": 1.0, "other_f": 1.0, "other_b": 1.0}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli.main([*argv, "--executor", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sprint: error: cannot read the executor's costs") and err.endswith(f"({bad})")


def test_messages_priced_from_the_ping_pong_table():
    prof = Profile.synthetic()
    prof.data["p2p"] = {"bytes": [256, 4096, 8192, 65536], "times": [1e-4, 1.2e-4, 4e-4, 6e-4], "eager_bytes": 4096}
    assert P.p2p_time(prof, 64) == pytest.approx(1e-4)
    assert P.p2p_time(prof, 1536) == pytest.approx(2.6e-4)                  # halfway 4096..8192 bytes
    assert P.p2p_time(prof, 2 * 65536 // 4) == pytest.approx(6e-4 + 65536 * (2e-4 / (65536 - 8192)))
    assert P.rendezvous_time(prof, 1024) == 0.0                              # eager: no handshake
    assert P.rendezvous_time(prof, 2048) == pytest.approx(3e-4)
    costs = P.stage_costs("digits", [(0, 1), (1, 4)], 32, 4, prof)           # conv1's 8 x 2048 floats
    assert costs[0].t_c == pytest.approx(P.p2p_time(prof, 8 * 2048)) and costs[0].t_h > 0
    assert costs[1].t_c == costs[1].t_h == 0.0


def test_a_busy_sender_holds_its_rendezvous_message_until_its_next_pass_ends():
    # two stages, gpipe, 2 micro-batches; passes 1 ms forward, 2 ms backward,
    # messages 0.5 ms of which 0.3 ms handshake (hand-played in the comments)
    def costs(t_h):
        return [P.StageCost(("x",), 1, 1e-3, 2e-3, 0.0, 5e-4, 0.0, t_h) for _ in range(2)]
    free = PS.play(costs(0.0), "gpipe", 2, 2)
    # F0 0-1, F0 1-2 | F1 1.5-2.5, 2.5-3.5 | B1 3.5-5.5, 5.5-7.5 | B0 6-8, 8-10
    assert free["makespan"] == pytest.approx(10e-3, rel=1e-9)
    held = PS.play(costs(3e-4), "gpipe", 2, 2, hold=True)
    # F0(0)'s activation waits for F0(1) to end: in at 2.2; F0(1)'s leaves while
    # stage 0 waits (in at 2.5). F1 2.2-3.2, 3.2-4.2; B1(0)'s gradient waits for
    # B1(1) (in at 8.4), B1(1)'s for the update (in at 8.7); B0 8.4-10.4, 10.4-12.4
    assert held["makespan"] == pytest.approx(12.4e-3, rel=1e-9)
    # by default the hold is played only where ranks share cores: with a core
    # each the messages move in t_c, as without a handshake
    assert PS.play(costs(3e-4), "gpipe", 2, 2)["makespan"] == pytest.approx(free["makespan"], rel=1e-9)
    assert PS.play(costs(3e-4), "gpipe", 2, 2, cores=2)["makespan"] == pytest.approx(12.4e-3, rel=1e-9)


def test_ranks_outnumbering_cores_slow_every_pass_by_shared():
    ex = P.Executor(per_pass=1e-4, cold=0.2, per_instruction=5e-5, shared=0.5)
    parts = [(0, 1), (1, 2), (2, 3), (3, 4)]
    own = P.stage_costs("digits", parts, 32, 4, PROF, executor=ex)
    over = P.stage_costs("digits", parts, 32, 4, PROF, executor=ex, oversubscribed=True)
    for a, b in zip(own, over):
        assert (b.t_f, b.t_b, b.t_u, b.t_x) == pytest.approx((1.5 * a.t_f, 1.5 * a.t_b, 1.5 * a.t_u, 1.5 * a.t_x))
        assert b.t_c == a.t_c
    # predict applies it only where the ranks outnumber the cores they share
    kw = dict(stages=4, n_subbatch=32, profile=PROF, partition=parts, executor=ex)
    alone = P.predict("digits", **kw)
    crowded = P.predict("digits", cores=2, **kw)
    assert alone.costs[0].t_f == pytest.approx(own[0].t_f)
    assert crowded.costs[0].t_f == pytest.approx(over[0].t_f)
