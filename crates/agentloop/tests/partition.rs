//! Faults of the network between hosts. Three "hosts" are Linux network namespaces on a bridge
//! of the test's own, each running a NATS node (three-node cluster, R3 streams,
//! `sync_interval: always`) and a runner; memory, the router, delivery, the fake model and
//! Postgres run in the test's own namespace, a fourth host. A partition takes one host's link
//! down for several lease lengths: its NATS node loses the quorum, its runner loses memory and
//! must stop, and the others take its sessions over. A slow link delays every byte to and from
//! one host (a proxy: this kernel has no netem). The history checker then verifies that every
//! acknowledged message was answered exactly once, in order, with no overlapping runs and each
//! input once in the transcript. Figures are printed (`--no-capture`), not asserted.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed fixture should panic the test

mod support;

use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream;

use agentloop_fake_model::{FakeModel, FakeModelConfig};
use agentloop_testkit::{
    ClusterPlan, DelayProxy, Hosts, Latency, NatsCluster, PrivatePostgres, ServiceProcess,
    TestDatabase, free_port, wait_until,
};
use support::load::{self, Load, in_flight_of};

const BIN: &str = env!("CARGO_BIN_EXE_agentloop");
const READY: Duration = Duration::from_secs(60);
const SESSIONS: usize = 18;
const PER_SESSION: usize = 6;
/// How long a partition lasts: eight lease lengths.
const CUT_FOR: Duration = Duration::from_secs(10);

/// The services placed on hosts, and the test's client of the cluster.
struct Spread {
    cluster: NatsCluster,
    /// `runner-1` … `runner-3`, on hosts 1 … 3.
    runners: Vec<ServiceProcess>,
    /// Memory, router and delivery, in the test's own namespace.
    central: Vec<ServiceProcess>,
    _fake: FakeModel,
    js: jetstream::Context,
    // Last: the namespaces go once the processes in them have.
    hosts: Hosts,
}

impl Spread {
    async fn start(database_url: &str) -> Self {
        let hosts = Hosts::create(3).unwrap();
        let places: Vec<(String, Option<String>)> = (1..=3)
            .map(|i| (hosts.host(i).ip.clone(), Some(hosts.host(i).netns.clone())))
            .collect();
        let cluster = NatsCluster::start_plan(ClusterPlan::placed(&places).unwrap())
            .await
            .unwrap();
        let fake = FakeModel::start(FakeModelConfig {
            listen: format!("{}:0", hosts.root_ip()),
            ..Default::default()
        })
        .await
        .unwrap();
        let js = load::connect(&cluster.urls()).await;
        load::create_capture(&js, 3).await;
        let memory = format!("{}:{}", hosts.root_ip(), free_port().unwrap());
        let env = stack_env(
            &cluster.urls(),
            database_url,
            &memory,
            &fake.openai_base_url(),
            "1200",
        );
        let mut central = Vec::new();
        for service in ["memory", "router", "delivery"] {
            central.push(ServiceProcess::spawn(BIN.as_ref(), service, service, &env).unwrap());
        }
        let mut runners = Vec::new();
        for i in 1..=3 {
            let name = format!("runner-{i}");
            let mut env = env.clone();
            env.push(("AGENTLOOP_RUNNER__OWNER_ID".into(), name.clone()));
            runners.push(
                ServiceProcess::spawn_in(BIN.as_ref(), "runner", &name, &env, hosts.host(i))
                    .unwrap(),
            );
        }
        for process in central.iter_mut().chain(runners.iter_mut()) {
            process.wait_ready(READY).await.unwrap();
        }
        Self {
            cluster,
            runners,
            central,
            _fake: fake,
            js,
            hosts,
        }
    }

    fn logs(&self) -> String {
        logs_of(
            self.central.iter().chain(self.runners.iter()),
            &self.cluster,
        )
    }
}

/// The last lines each process logged, then the cluster's, for a failing test's message.
fn logs_of<'a>(
    processes: impl Iterator<Item = &'a ServiceProcess>,
    cluster: &NatsCluster,
) -> String {
    let mut text = String::new();
    for process in processes {
        text.push_str(&format!(
            "--- {} ---\n{}\n",
            process.name(),
            load::tail(&process.logs(), 40)
        ));
    }
    text + &cluster.logs()
}

/// The services' settings on the cluster at `nats_urls`, with a lease of `lease_ms` swept
/// every 200 ms, as the failover figures in `docs/scaling.md` assume.
fn stack_env(
    nats_urls: &str,
    database_url: &str,
    memory: &str,
    model_url: &str,
    lease_ms: &str,
) -> Vec<(String, String)> {
    let mut env = load::cluster_env(nats_urls, database_url, memory, model_url);
    env.push(("AGENTLOOP_RUNNER__LEASE_TTL_MS".into(), lease_ms.into()));
    env.push(("AGENTLOOP_RUNNER__SWEEP_INTERVAL_MS".into(), "200".into()));
    env
}

/// Runs of `owner`, and runs taken up again after an owner lost them.
async fn runs_of(pool: &sqlx::PgPool, owner: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE owner = $1), count(*) FILTER (WHERE attempts > 1) \
         FROM runs",
    )
    .bind(owner)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Under load, cuts host 1 off once its runner has runs in flight, keeps it cut for
/// [`CUT_FOR`] while `meanwhile` runs, heals it and checks the history. Prints the failover:
/// from the cut to the first reply to any run host 1 had in flight.
async fn partition_under_load<F, Fut>(
    what: &str,
    database_url: &str,
    pool: &sqlx::PgPool,
    meanwhile: F,
) where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let spread = Spread::start(database_url).await;
    let load = Load::start(
        &spread.js,
        "partition",
        SESSIONS,
        PER_SESSION,
        "[[delay_ms:200]]",
    );
    load.acked(SESSIONS * 2).await;
    wait_until(
        "runner-1 to be mid-run",
        Duration::from_secs(30),
        || async { (!in_flight_of(pool, "runner-1").await.is_empty()).then_some(()) },
    )
    .await
    .unwrap();
    let moved = in_flight_of(pool, "runner-1").await;

    spread.hosts.cut(1).unwrap();
    let cut_at = SystemTime::now();
    let cut = Instant::now();
    meanwhile().await;
    tokio::time::sleep(CUT_FOR.saturating_sub(cut.elapsed())).await;
    spread.hosts.heal(1).unwrap();
    let accepted = load.finish().await;

    let history = load::verify(&spread.js, pool, accepted, cut_at, what, || spread.logs()).await;
    let failover = history
        .replies
        .iter()
        .filter(|r| moved.contains(&r.tag) && r.at > cut_at)
        .map(|r| r.at.duration_since(cut_at).unwrap_or_default())
        .min();
    let (_, resumed) = runs_of(pool, "runner-1").await;
    println!(
        "failover after host 1 was cut off (lease 1.2 s, sweep 200 ms): {failover:?} \
         for the {} runs it had in flight; {resumed} runs resumed by another owner",
        moved.len(),
    );
    assert!(
        failover.is_some(),
        "the runs host 1 had in flight were answered by another runner"
    );
    assert!(resumed > 0, "some run moved off the cut-off host");
    // Healed, the cut-off runner is a working replica again.
    let runner = &spread.runners[0];
    wait_until("runner-1 ready again", Duration::from_secs(30), || async {
        runner.is_ready().await.then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", spread.logs()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_past_its_lease_loses_nothing_and_its_sessions_move() {
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool().await.unwrap();
    partition_under_load("host 1 cut off for 10 s", db.url(), &pool, || async {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_while_a_host_is_cut_off_loses_nothing() {
    // A Postgres of this test alone, since it is the one restarted.
    let pg = tokio::task::block_in_place(PrivatePostgres::start).unwrap();
    // Its own default database: the test's fresh one, which memory migrates.
    let database_url = pg.url("postgres");
    let pool = sqlx::PgPool::connect(&database_url).await.unwrap();
    let pg = std::sync::Mutex::new(pg);
    let what = "host 1 cut off for 10 s, Postgres down for 2 s of it";
    partition_under_load(what, &database_url, &pool, || async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::block_in_place(|| pg.lock().unwrap().stop()).unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        tokio::task::block_in_place(|| pg.lock().unwrap().start_again()).unwrap();
    })
    .await;
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_link_to_one_host_delays_its_work_and_loses_nothing() {
    // Host 2 (node n2 and runner-2) sits behind 200 ms ± 100 ms each way: every connection to
    // or from it goes through a delaying proxy, the cluster's routes included (n2 advertises
    // its proxy, and dials the others through theirs).
    let latency = Latency {
        base: Duration::from_millis(200),
        jitter: Duration::from_millis(100),
    };
    let slow = |target: String| async move {
        DelayProxy::start("127.0.0.1", &target, latency)
            .await
            .unwrap()
    };
    let mut plan = ClusterPlan::loopback(3).unwrap();
    let routes: Vec<String> = plan
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.route_port))
        .collect();
    let route = |i: usize| routes[i].clone();
    let into_n2 = slow(route(1)).await;
    let n2_to_n1 = slow(route(0)).await;
    let n2_to_n3 = slow(route(2)).await;
    let n2_clients = slow(format!("127.0.0.1:{}", plan.nodes[1].port)).await;
    let direct = |i: usize| format!("nats://{}", route(i));
    let others_routes = vec![direct(0), format!("nats://{}", into_n2.addr()), direct(2)];
    plan.nodes[0].routes.clone_from(&others_routes);
    plan.nodes[2].routes = others_routes;
    plan.nodes[1].routes = vec![
        format!("nats://{}", n2_to_n1.addr()),
        direct(1),
        format!("nats://{}", n2_to_n3.addr()),
    ];
    plan.nodes[1].advertise = Some(into_n2.addr().to_owned());
    let seeds = format!(
        "nats://127.0.0.1:{},nats://{},nats://127.0.0.1:{}",
        plan.nodes[0].port,
        n2_clients.addr(),
        plan.nodes[2].port
    );
    let cluster = NatsCluster::start_plan(plan).await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let pool = db.pool().await.unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let js = load::connect(&seeds).await;
    load::create_capture(&js, 3).await;
    let memory = format!("127.0.0.1:{}", free_port().unwrap());
    // A lease of 3 s: renewals from the slow host take 0.2-0.6 s there and back.
    let env = stack_env(&seeds, db.url(), &memory, &fake.openai_base_url(), "3000");
    let mut processes = Vec::new();
    for service in ["memory", "router", "delivery"] {
        processes.push(ServiceProcess::spawn(BIN.as_ref(), service, service, &env).unwrap());
    }
    let memory_slow = slow(memory.clone()).await;
    let model_slow = slow(fake.base_url().trim_start_matches("http://").to_owned()).await;
    let runner = |i: usize| {
        let name = format!("runner-{i}");
        let mut env = env.clone();
        env.push(("AGENTLOOP_RUNNER__OWNER_ID".into(), name.clone()));
        if i == 2 {
            // Its own node, memory and the model, each across the slow link.
            let set = |env: &mut Vec<(String, String)>, key: &str, value: String| {
                env.retain(|(k, _)| k != key);
                env.push((key.to_owned(), value));
            };
            set(
                &mut env,
                "NATS_URL",
                format!("nats://{}", n2_clients.addr()),
            );
            set(
                &mut env,
                "AGENTLOOP_MEMORY__URL",
                format!("http://{}", memory_slow.addr()),
            );
            set(
                &mut env,
                "OPENAI_BASE_URL",
                format!("http://{}/v1", model_slow.addr()),
            );
        }
        ServiceProcess::spawn(BIN.as_ref(), "runner", &name, &env).unwrap()
    };
    // The slow host's runner starts alone and takes the first sessions, so it has work
    // whatever the faster runners take once they join.
    processes.push(runner(2));
    for process in &mut processes {
        process.wait_ready(READY).await.unwrap();
    }
    let started_at = SystemTime::now();
    let load = Load::start(&js, "slow", SESSIONS, PER_SESSION, "");
    wait_until(
        "runner-2 to run something",
        Duration::from_secs(30),
        || async { (runs_of(&pool, "runner-2").await.0 > 0).then_some(()) },
    )
    .await
    .unwrap();
    for i in [1, 3] {
        let mut process = runner(i);
        process.wait_ready(READY).await.unwrap();
        processes.push(process);
    }
    let logs = || logs_of(processes.iter(), &cluster);

    let accepted = load.finish().await;
    let history = load::verify(
        &js,
        &pool,
        accepted,
        started_at,
        "host 2 behind 200 ms ± 100 ms",
        logs,
    )
    .await;

    let (slow_runs, resumed) = runs_of(&pool, "runner-2").await;
    let took = history
        .replies
        .last()
        .and_then(|r| r.at.duration_since(started_at).ok());
    println!(
        "slow host: runner-2 ran {slow_runs} of {} runs; {resumed} resumed by another owner; \
         all answered {took:?} after the first publish",
        SESSIONS * PER_SESSION
    );
    assert!(slow_runs > 0, "the slow host took part:\n{}", logs());
}
