"""The campaign's pieces that need no cluster: the fault table and its published weights, the seeded
schedule, the grade, the dead man's switch, the ranks' control files. The campaign end to end is
tests/test_campaign_e2e.py."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from babysitter.campaign.cluster import campaign_config, pace_policy
from babysitter.campaign.faults import GREYHOUND, KINDS, LLAMA3, draw_weights, kind
from babysitter.campaign.rank import Control
from babysitter.campaign.schedule import Fault, Schedule, Shape, build_schedule, duration, timing_for
from babysitter.campaign.score import Score, score, switch_pages
from babysitter.demo.pager import Page
from babysitter.generate.config import parse_duration

FAST, DEFAULT = timing_for("fast"), timing_for("default")


class TestFaults:
    def test_every_kind_says_what_it_must_page_and_the_remedy(self) -> None:
        from babysitter.generate.alerts import alerts
        from babysitter.generate.config import GenerateConfig

        names = {a.name for a in alerts(GenerateConfig())} | {"DeadMansSwitch"}
        for k in KINDS:
            assert k.expect and set(k.alerts) <= names, k.name
            assert k.remedy in ("drain+requeue", "drain", "requeue", "annotate", "none"), k.name

    def test_llama3_weights_add_up_to_the_published_counts(self) -> None:
        """Each kind drawn for a Llama 3 row carries a share of that row's count; together the rows
        the campaign plays add up to exactly what the table says (SRAM's ECC errors are drawn as Xid 48)."""
        by_row: Counter[str] = Counter()
        for k in KINDS:
            if k.source.startswith("llama3:"):
                by_row[k.source.split(":", 1)[1]] += k.weight
        by_row["GPU HBM3 memory"] -= 19  # xid48 carries SRAM's 19 too
        by_row["GPU SRAM memory"] += 19
        assert {row: round(count, 6) for row, count in by_row.items()} == {
            row: float(count) for row, count in LLAMA3.items()
        }
        weights = draw_weights("llama3")
        assert abs(sum(weights.values()) - 1) < 1e-9
        assert weights["xid79"] == pytest.approx(74 / sum(LLAMA3.values()))

    def test_greyhound_shares(self) -> None:
        weights = draw_weights("greyhound")
        comm = sum(w for n, w in weights.items() if kind(n).source == "greyhound:communication")
        assert comm == pytest.approx(GREYHOUND["communication"] / sum(GREYHOUND.values()))
        with pytest.raises(ValueError, match="llama3 or greyhound"):
            draw_weights("minder")


class TestSchedule:
    def test_the_same_seed_plays_the_same_campaign(self) -> None:
        cfg = campaign_config("fast")
        one = build_schedule(7, cfg, FAST, Shape())
        assert one == build_schedule(7, cfg, FAST, Shape())
        assert one.to_json() != build_schedule(8, cfg, FAST, Shape()).to_json()
        assert json.loads(json.dumps(one.to_json()))["seed"] == 7

    def test_coverage_plays_every_kind_once_in_sequence(self) -> None:
        cfg = campaign_config("fast")
        s = build_schedule(1, cfg, FAST, Shape())
        assert sorted(f.kind for f in s.faults) == sorted(k.name for k in KINDS)
        for before, after in zip(s.faults, s.faults[1:], strict=False):
            assert before.until <= after.at, "one fault at a time, settled before the next"
            assert after.at - before.until >= FAST.quiet[0]
        assert s.faults[0].at == FAST.warmup
        assert all(n.kind in ("eval", "slow_save", "restart") for n in s.noise)
        windows = [(f.at, f.until) for f in s.faults]
        assert not any(lo <= n.at < hi for n in s.noise for lo, hi in windows), "noise only in quiet time"

    def test_the_shipped_profile_leaves_out_what_it_cannot_play_and_says_why(self) -> None:
        cfg = campaign_config("default")
        s = build_schedule(1, cfg, DEFAULT, Shape())
        assert {"slow_input", "slow_storage"}.isdisjoint(f.kind for f in s.faults)
        with pytest.raises(
            ValueError, match="slow_storage cannot be played at the default profile: the shipped"
        ):
            build_schedule(1, cfg, DEFAULT, Shape(), kinds=["slow_storage"])
        with pytest.raises(KeyError, match="unknown fault"):
            build_schedule(1, cfg, DEFAULT, Shape(), kinds=["meteor"])

    @pytest.mark.parametrize("profile", ["fast", "default"])
    def test_each_fault_lasts_past_its_alerts_windows(self, profile: str) -> None:
        """A fault shorter than its rule's for: (or window) could never page: each lasts longer."""
        cfg, t = campaign_config(profile), timing_for(profile)
        floors = {
            "xid79": parse_duration(cfg.gpu_down_for),
            "throttle": parse_duration(cfg.throttle_for),
            "pcie_downtrained": parse_duration(cfg.pcie_degraded_for),
            "ib_down": parse_duration(cfg.fabric_port_down_for),
            "straggler": parse_duration(cfg.straggler_for),
            "hang": cfg.stall_min_seconds,
            "slow_input": parse_duration(cfg.mfu_drop_for),
            "agent_killed": parse_duration(cfg.target_down_for),
            "alertmanager_down": t.switch_period,
        }
        for name, floor in floors.items():
            assert duration(kind(name), cfg, t) > floor + t.pipeline, name

    @pytest.mark.parametrize("profile", ["fast", "default"])
    def test_a_hang_is_held_until_the_example_policy_would_act(self, profile: str) -> None:
        """A real hang lasts until something acts: the campaign holds it past its page for as long as
        the example policy's stall rule waits at the profile's pace, so that its remedy can be graded."""
        import yaml

        cfg, t = campaign_config(profile), timing_for(profile)
        policy = yaml.safe_load(
            (Path(__file__).parents[1] / "exporters/remediate-policy.example.yaml").read_text()
        )
        pace_policy(policy, t.policy_scale)
        stall = [r for r in policy["rules"] if "TrainingStalled" in r["match"]["alertname"]]
        assert len(stall) == 1 and parse_duration(stall[0]["firing_for"]) == t.hang_hold
        page = (
            max(cfg.stall_min_seconds, cfg.stall_step_factor * t.step_seconds)
            + parse_duration(cfg.culprit_silent_for)
            + t.pipeline
        )
        assert duration(kind("hang"), cfg, t) >= page + t.hang_hold
        # Every other wait is paced alike; a policy without firing_for is left as it is.
        paced = {"rules": [{"firing_for": "1m"}, {"actions": ["drain"]}]}
        pace_policy(paced, 1 / 12)
        assert paced == {"rules": [{"firing_for": "5s"}, {"actions": ["drain"]}]}

    def test_draws_follow_the_published_weights(self) -> None:
        """4,000 draws by Llama 3's counts land within 2.5 points of each kind's share."""
        cfg = campaign_config("fast")
        s = build_schedule(3, cfg, FAST, Shape(), kinds=["edac_ue"], draw=4000, noise=False)
        drawn = Counter(f.kind for f in s.faults if f.kind != "edac_ue")
        for name, share in draw_weights("llama3").items():
            assert abs(drawn[name] / 4000 - share) < 0.025, (name, drawn[name], share)
        assert sum(drawn.values()) == 4000

    @pytest.mark.parametrize("profile", ["fast", "default"])
    def test_noise_is_over_before_the_next_fault(self, profile: str) -> None:
        """Shipped seed 2 played a NaN loss inside a 300 s healthy save: no step ran, so no NaN either,
        and the fault was scored missed without having been played."""
        t, cfg = timing_for(profile), campaign_config(profile)
        gap = t.pipeline  # a scrape, an evaluation and a group_wait: the noise's last effect is seen
        for seed in range(1, 9):
            s = build_schedule(seed, cfg, t, Shape())
            assert any(n.seconds for n in s.noise)
            for n in s.noise:
                following = [f.at for f in s.faults if f.at > n.at]
                if following:
                    assert n.at + n.seconds + gap <= min(following) + 0.2, (seed, n)

    @pytest.mark.parametrize("profile", ["fast", "default"])
    def test_a_gpu_that_failed_hard_is_not_hit_again_within_its_alerts_window(self, profile: str) -> None:
        """Its GpuXidCritical lasts the Xid window and inhibits the next page on the GPU: shipped seed 2
        lost an Xid 48 to the row-remap failure 6 minutes before on the same GPU. A real cluster has
        drained that node; the campaign's remediator only plans, so the schedule moves the fault."""
        t, cfg = timing_for(profile), campaign_config(profile)
        hold = max(parse_duration(cfg.xid_window), parse_duration(cfg.ecc_window))
        hard_gpu = [k.name for k in KINDS if k.area == "gpu" and k.nature == "hard"]
        for seed in range(1, 13):
            s = build_schedule(seed, cfg, t, Shape(), kinds=hard_gpu * 2)
            last: dict[int, float] = {}
            for f in s.faults:
                host = f.culprit["host"]
                assert f.culprit["rank"] == host
                assert f.at - last.get(host, float("-inf")) >= hold or all(
                    f.at - at < hold for at in last.values()
                ), (seed, f)
                last[host] = f.at

    def test_culprits_are_places_of_the_cluster(self) -> None:
        shape = Shape(hosts=4, gpus=2)
        s = build_schedule(11, campaign_config("fast"), FAST, shape)
        for f in s.faults:
            if "host" in f.culprit:
                assert 0 <= f.culprit["host"] < 4
            if "rank" in f.culprit:
                assert 0 <= f.culprit["rank"] < 4
            if f.kind == "diverged":
                assert f.culprit["rank"] != 0, "rank 0 saves the checkpoint the job rolls back to"


def test_the_dead_mans_switch_pages_once_per_silence_longer_than_its_period() -> None:
    beats = [10.0, 15.0, 20.0, 60.0, 65.0]
    assert switch_pages(beats, 20.0, 0.0, 70.0) == [40.0]
    assert switch_pages(beats, 20.0, 0.0, 100.0) == [40.0, 85.0]
    assert switch_pages([], 20.0, 0.0, 30.0) == [20.0]
    assert switch_pages(beats, 60.0, 0.0, 70.0) == []


def _page(
    t: float, name: str, receiver: str = "pager", status: str = "firing", n: int = 0, **labels: str
) -> Page:
    return Page(
        t,
        status,
        name,
        "critical",
        {"alertname": name, **labels},
        receiver=receiver,
        notification=n or int(t * 10),
    )


class TestScore:
    SCHEDULE = Schedule(
        seed=1,
        profile="fast",
        shape=Shape(),
        faults=(
            Fault("xid79", 100.0, 30.0, {"host": 1, "gpu": 0, "rank": 1}, 160.0),
            Fault("ib_down", 200.0, 30.0, {"host": 2, "device": "mlx5_1", "port": "1"}, 260.0),
            Fault("hang", 300.0, 40.0, {"rank": 2, "host": 2}, 370.0),
            Fault("edac_ue", 400.0, 30.0, {"host": 0, "controller": "1"}, 460.0),
        ),
        noise=(),
        length=500.0,
    )
    CULPRITS = {
        0: {"host": "h1:9", "gpu": "0", "rank": "1"},
        1: {"host": "h2:9", "device": "mlx5_1", "port": "1"},
        2: {"rank": "2", "host": "h2:9"},
        3: {"host": "h0:9", "controller": "1"},
    }

    def test_a_campaign_graded(self) -> None:
        pages = [
            # Xid 79: the page names host h1, GPU 0, 3 s in; GpuDown later; one resolve before the end.
            _page(103.0, "GpuXidCritical", instance="h1:9", gpu="0"),
            _page(103.0, "GpuXidCritical", "chat", instance="h1:9", gpu="0"),
            _page(112.0, "GpuDown", instance="h1:9", gpu="0"),
            _page(120.0, "GpuXidCritical", status="resolved", instance="h1:9", gpu="0"),
            _page(140.0, "GpuDown", status="resolved", instance="h1:9", gpu="0"),
            # Sent again beside another alert of its group: not news, never counted twice.
            _page(125.0, "GpuDown", instance="h1:9", gpu="0"),
            # The port: the page names the wrong device; and a stall of the run follows (a consequence).
            _page(207.0, "InfinibandPortDown", instance="h2:9", device="mlx5_0", port="1"),
            _page(215.0, "TrainingStalled", run="r"),
            # The hang is missed; a GPU page about host h1 (two faults ago: no longer "left over") arrives.
            _page(330.0, "GpuDown", instance="h1:9", gpu="0"),
            # EDAC: detected, and a page about host h2, which its fault never touched.
            _page(401.0, "HostMemoryUncorrectableError", instance="h0:9", controller="1"),
            _page(402.0, "NodeAgentDown", instance="h9:9"),
            # Healthy time: a false page, a false chat warning, the heartbeat (never counted).
            _page(180.0, "TrainingGoodputLow", "chat", run="r"),
            _page(480.0, "CheckpointOverdue", run="r"),
            _page(50.0, "Watchdog", "deadmansswitch"),
        ]
        records = [
            {"t": 104.0, "event": "action", "action": "drain", "host": "h1", "result": "dry_run"},
            {"t": 104.1, "event": "action", "action": "requeue", "job": "4242", "result": "dry_run"},
            {"t": 208.0, "event": "action", "action": "drain", "host": "h0", "result": "dry_run"},
        ]
        s = score(self.SCHEDULE, pages, 0.0, culprits=self.CULPRITS, remediations=records)
        xid, port, hang, edac = s.faults
        assert (xid.detected, xid.first_after, xid.first_alert, xid.first_receiver, xid.culprit_named) == (
            True,
            3.0,
            "GpuXidCritical",
            "pager",
            "right",
        )
        assert (xid.pager_notifications, xid.resolved_mid_fault, xid.chat_notifications) == (3, 1, 1)
        assert (xid.remedy, xid.remedy_planned) == ("right", ("drain h1", "requeue job 4242"))
        assert (port.detected, port.culprit_named, port.consequences) == (True, "wrong", ("TrainingStalled",))
        assert port.remedy == "wrong"  # drained a host the fault never touched
        assert (hang.detected, hang.culprit_named, hang.remedy) == (False, "-", "missed")
        assert (hang.wrong_place, hang.left_over) == (("GpuDown",), ())
        assert edac.wrong_place == ("NodeAgentDown",) and edac.remedy == "missed"
        assert [p["alert"] for p in s.false_pages] == ["CheckpointOverdue"]
        assert [p["alert"] for p in s.false_chat] == ["TrainingGoodputLow"]
        summary = s.summary
        assert (
            summary["faults"],
            summary["detected"],
            summary["culprit_right"],
            summary["culprit_wrong"],
        ) == (4, 3, 2, 1)
        assert summary["healthy_hours"] == pytest.approx((500 - 60 - 60 - 70 - 60) / 3600, abs=1e-3)
        assert summary["false_pages"] == 1 and summary["wrong_place"] == 2

    def test_a_goodput_warning_about_a_fault_in_its_window_is_hindsight_not_false(self) -> None:
        """TrainingGoodputLow judges the goodput window behind it: after a fault inside that window it
        says something true (the seed-1 campaign counted 13 such warnings as false). A page of it, or
        one with no fault in its window, stays false."""
        pages = [
            _page(180.0, "TrainingGoodputLow", "chat", run="r"),  # Xid 79 began 80 s before
            _page(90.0, "TrainingGoodputLow", "chat", n=1, run="q"),  # no fault before it
            _page(185.0, "TrainingGoodputLow", run="p"),  # paged: never excused
        ]
        s = score(self.SCHEDULE, pages, 0.0, culprits=self.CULPRITS, hindsight={"TrainingGoodputLow": 100.0})
        assert [p["t"] for p in s.hindsight_chat] == [180.0]
        assert [p["t"] for p in s.false_chat] == [90.0]
        assert [p["t"] for p in s.false_pages] == [185.0]
        assert (s.summary["hindsight_chat"], s.summary["false_chat"]) == (1, 1)
        # Out of its window (50 s back from 180 s reaches 130 s; the fault began at 100 s): false.
        s = score(
            self.SCHEDULE, pages[:1], 0.0, culprits=self.CULPRITS, hindsight={"TrainingGoodputLow": 50.0}
        )
        assert (len(s.hindsight_chat), len(s.false_chat)) == (0, 1)

    def test_only_the_faults_own_page_resolving_is_resolved_early(self) -> None:
        """Another alert's resolve inside the fault's window (the previous fault's echo) is not the
        fault's page resolving in the middle of it."""
        pages = [
            _page(401.0, "HostMemoryUncorrectableError", instance="h0:9", controller="1"),
            _page(410.0, "RuleEvaluationFailing", status="resolved", instance="mon:9090"),
            _page(420.0, "HostMemoryUncorrectableError", status="resolved", instance="h0:9", controller="1"),
        ]
        edac = score(self.SCHEDULE, pages[:2], 0.0, culprits=self.CULPRITS).faults[3]
        assert edac.resolved_mid_fault == 0
        edac = score(self.SCHEDULE, pages, 0.0, culprits=self.CULPRITS).faults[3]
        assert edac.resolved_mid_fault == 1

    def test_a_page_about_the_previous_faults_place_is_left_over(self) -> None:
        pages = [_page(210.0, "GpuDown", instance="h1:9", gpu="0")]
        s = score(self.SCHEDULE, pages, 0.0, culprits=self.CULPRITS)
        assert s.faults[1].left_over == ("GpuDown",) and s.faults[1].wrong_place == ()

    def test_an_alert_still_firing_when_the_fault_began_and_sent_again_is_resent(self) -> None:
        """Seed 1: InfinibandSymbolErrors (a one-hour budget) still fired from its fault when
        Prometheus was restarted; Alertmanager resolved it meanwhile and it fired again, inside the
        restart's window, where it was counted as naming a place no fault touched. Sent again, it is
        "resent"; the same alert begun in the window, or fired and resolved before it, is not."""
        port = {"instance": "h1:9", "device": "mlx5_1", "port": "1"}
        pages = [
            _page(110.0, "InfinibandSymbolErrors", "chat", **port),
            _page(402.0, "InfinibandSymbolErrors", "chat", status="resolved", **port),
            _page(440.0, "InfinibandSymbolErrors", "chat", **port),
        ]
        edac = score(self.SCHEDULE, pages, 0.0, culprits=self.CULPRITS).faults[3]
        assert (edac.resent, edac.wrong_place, edac.consequences) == (("InfinibandSymbolErrors",), (), ())
        for before in (
            pages[2:],
            [pages[0], _page(150.0, "InfinibandSymbolErrors", "chat", status="resolved", **port), pages[2]],
        ):
            edac = score(self.SCHEDULE, before, 0.0, culprits=self.CULPRITS).faults[3]
            assert (edac.resent, edac.wrong_place) == ((), ("InfinibandSymbolErrors",))

    def test_a_stall_page_names_the_culprit_rank_and_host_or_not(self) -> None:
        def stalled(summary: str, hosts: str) -> Page:
            return Page(
                310.0,
                "firing",
                "TrainingStalled",
                "critical",
                {"alertname": "TrainingStalled", "run": "r"},
                summary=summary,
                receiver="pager",
                notification=1,
                annotations={"culprit_hosts": hosts},
            )

        for summary, hosts, verdict in (
            ("Run r has not finished a step for 20s; culprit rank 2 on host h2:9.", "h2:9", "right"),
            (
                "Run r has not finished a step for 20s: likely straggler on host h0:9; culprit rank 2 on host h2:9.",
                "h2:9",
                "wrong",
            ),
            ("Run r has not finished a step for 20s.", "", "unnamed"),
            ("Run r has not finished a step for 20s; culprit rank 1 on host h1:9.", "h1:9", "wrong"),
        ):
            s = score(self.SCHEDULE, [stalled(summary, hosts)], 0.0, culprits=self.CULPRITS)
            assert s.faults[2].culprit_named == verdict, summary

    def test_the_exits_of_a_killed_jobs_other_ranks_are_its_consequence(self) -> None:
        """Xid 79 killed rank 1 on h1, and torchrun the others: rank 2's exit on h2 is true and about
        this fault. During a fault that kills no process (EDAC), an exit elsewhere is still wrong."""
        xid = score(
            self.SCHEDULE,
            [_page(110.0, "TrainingProcessExited", "chat", instance="h2:9")],
            0.0,
            culprits=self.CULPRITS,
        ).faults[0]
        assert (xid.consequences, xid.wrong_place) == (("TrainingProcessExited",), ())
        edac = score(
            self.SCHEDULE,
            [_page(410.0, "TrainingProcessExited", "chat", instance="h9:9")],
            0.0,
            culprits=self.CULPRITS,
        ).faults[3]
        assert edac.wrong_place == ("TrainingProcessExited",)

    def test_a_notification_sent_after_its_fault_but_begun_in_it_is_late_not_false(self) -> None:
        """Alertmanager adds a new alert to a group already notified at its group_interval (chat: 5 m):
        shipped seed 2's exits on a second host arrived after the fault's window. Its startsAt says
        when it began; begun in healthy time, or about another place, it stays false."""
        late = Page(
            175.0,
            "firing",
            "TrainingProcessExited",
            "warning",
            {"alertname": "TrainingProcessExited", "instance": "h2:9"},
            receiver="chat",
            notification=7,
            starts_at=120.0,
        )
        s = score(self.SCHEDULE, [late], 0.0, culprits=self.CULPRITS)
        assert ([p["t"] for p in s.late], s.false_chat, s.summary["late"]) == ([175.0], (), 1)
        assert s.faults[0].pager_notifications == 0
        # Paged late, it is one of the fault's pages (one page per fault), and still no false page.
        paged = Page(**{**late.__dict__, "receiver": "pager", "notification": 8})
        s = score(
            self.SCHEDULE,
            [_page(103.0, "GpuXidCritical", instance="h1:9", gpu="0"), paged],
            0.0,
            culprits=self.CULPRITS,
        )
        assert (s.faults[0].pager_notifications, s.false_pages, len(s.late)) == (2, (), 1)
        for other in (
            Page(**{**late.__dict__, "starts_at": 170.0}),  # began in healthy time
            Page(**{**late.__dict__, "name": "GpuDown", "labels": {"instance": "h2:9"}}),  # not Xid 79's
        ):
            s = score(self.SCHEDULE, [other], 0.0, culprits=self.CULPRITS)
            assert (s.late, len(s.false_chat)) == ((), 1)

    def test_a_resolved_heartbeat_is_no_heartbeat(self) -> None:
        """When Prometheus stops, Alertmanager keeps Watchdog until its endsAt and then resolves it; the
        shipped receiver does not send resolves (send_resolved: false), so the switch hears nothing.
        Counted as a beat, the resolve at 215 s put the switch's page past the end (shipped seed 2)."""
        beats = [_page(t, "Watchdog", "deadmansswitch") for t in range(0, 200, 5)]
        resolved = [_page(215.0, "Watchdog", "deadmansswitch", status="resolved")]
        s = score(self.SCHEDULE, beats + resolved, 0.0, culprits=self.CULPRITS, switch_period=20.0, end=230.0)
        assert s.faults[1].consequences == ("DeadMansSwitch",)  # paged at 215 s: 195 s + 20 s

    def test_a_campaign_played_in_parts_is_graded_as_one(self) -> None:
        """The shipped profile's hours run as parts side by side; their JSON grades merge into one
        summary: one part alone gives its own summary back, two add their faults and healthy time."""
        pages = [
            _page(103.0, "GpuXidCritical", instance="h1:9", gpu="0"),
            _page(207.0, "InfinibandPortDown", instance="h2:9", device="mlx5_0", port="1"),
            _page(480.0, "CheckpointOverdue", run="r"),
            _page(180.0, "TrainingGoodputLow", "chat", run="r"),
        ]
        part = json.loads(json.dumps(score(self.SCHEDULE, pages, 0.0, culprits=self.CULPRITS).to_json()))
        assert Score.merged([part]).summary == part["summary"]
        whole = Score.merged([part, part]).summary
        one = part["summary"]
        for key in ("faults", "detected", "culprit_right", "culprit_wrong", "false_pages", "false_chat"):
            assert whole[key] == 2 * one[key], key
        for key in ("recall", "false_pages_per_healthy_hour", "notifications_per_fault", "paged_median_s"):
            assert whole[key] == one[key], key
        assert whole["healthy_hours"] == pytest.approx(2 * part["healthy_seconds"] / 3600, abs=1e-3)

    def test_the_switch_pages_when_heartbeats_stop(self) -> None:
        beats = [_page(t, "Watchdog", "deadmansswitch") for t in range(0, 200, 5)]
        beats += [_page(t, "Watchdog", "deadmansswitch") for t in range(240, 500, 5)]
        s = score(self.SCHEDULE, beats, 0.0, culprits=self.CULPRITS, switch_period=20.0)
        # Silence from 195 to 240: the switch pages at 215, inside the port fault's window.
        assert s.faults[1].consequences == ("DeadMansSwitch",)
        assert s.false_pages == ()


def test_rank_control_reads_bounded_settings_and_ignores_garbage(tmp_path: Path) -> None:
    control = Control(tmp_path, 1)
    assert not control.poll(0.0)
    (tmp_path / "rank1.json").write_text(
        json.dumps({"slow": 1e9, "data_wait": -3, "nan": True, "diverge": 2})
    )
    (tmp_path / "job.json").write_text(json.dumps({"evals": [[40, 5.0], "x", [1]], "stop_at": 99}))
    assert control.poll(1.0)
    assert (control.mine.slow, control.mine.data_wait, control.mine.nan, control.mine.diverge) == (
        50.0,
        0.0,
        True,
        2,
    )
    assert (control.job.evals, control.job.stop_at) == ([(40, 5.0)], 99)
    assert not control.poll(1.1)  # too soon, and nothing changed anyway
    (tmp_path / "rank1.json").write_text("{not json")
    random.seed(0)
    assert not control.poll(5.0)  # a torn file is skipped, the last good settings stay
    assert control.mine.slow == 50.0


def test_a_notifications_alerts_say_when_they_began() -> None:
    """Alertmanager writes startsAt in RFC 3339 with nanoseconds; the grade reads it (late
    notifications). An absent, garbled or zero time reads as 0: unknown, never a moment."""
    from babysitter.demo.pager import parse_notification

    body = {
        "receiver": "chat",
        "status": "firing",
        "alerts": [
            {"labels": {"alertname": "A"}, "startsAt": "2026-12-03T22:37:38.212345678Z"},
            {"labels": {"alertname": "B"}, "startsAt": "2026-12-03T23:37:38+01:00"},
            {"labels": {"alertname": "C"}, "startsAt": "0001-01-01T00:00:00Z"},
            {"labels": {"alertname": "D"}, "startsAt": "yesterday"},
            {"labels": {"alertname": "E"}},
        ],
    }
    pages = parse_notification(body, 1.0)
    assert pages[0].starts_at == pytest.approx(1796337458.212345, abs=1e-6)
    assert pages[1].starts_at == 1796337458.0
    assert [p.starts_at for p in pages[2:]] == [0.0, 0.0, 0.0]
