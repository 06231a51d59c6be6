//! `[bus]` TLS and logins against nats-servers that require them: certificates made with the
//! `openssl` command and nkeys made for the test only.

use agentloop_bus::{Bus, BusConfig, BusError};
use agentloop_testkit::NatsServer;

#[tokio::test]
async fn a_service_reaches_a_tls_only_server_with_the_configured_ca_and_login() {
    let dir = std::env::temp_dir().join(format!("agentloop-tls-{}", agentloop_bus::nuid()));
    std::fs::create_dir_all(&dir).unwrap();
    agentloop_testkit::certs::make_ca(&dir, "ca");
    agentloop_testkit::certs::make_server_certificate(&dir);
    let conf = dir.join("tls.conf");
    std::fs::write(
        &conf,
        format!(
            "tls {{\n  cert_file: \"{0}/server.pem\"\n  key_file: \"{0}/server.key\"\n}}\n\
             authorization {{\n  user: svc\n  password: $SVC_PASSWORD\n}}\n",
            dir.display()
        ),
    )
    .unwrap();
    let nats =
        NatsServer::start_with_config(&conf, &[("SVC_PASSWORD".into(), "tls-secret".into())])
            .unwrap();
    let config = BusConfig {
        url: nats.url().to_owned(),
        prefix: format!("t{}", &agentloop_bus::nuid()[20..]),
        user: "svc".to_owned(),
        password: "tls-secret".to_owned(),
        tls_ca_file: dir.join("ca.pem").display().to_string(),
        ..Default::default()
    };

    Bus::connect(&config, "tls-test").await.unwrap();

    let unknown_ca = BusConfig {
        tls_ca_file: String::new(),
        ..config.clone()
    };
    let refused = Bus::connect(&unknown_ca, "tls-test").await;
    assert!(
        matches!(refused, Err(BusError::Connect { .. })),
        "a server certificate from an unknown CA was accepted"
    );
    let no_login = BusConfig {
        user: String::new(),
        password: String::new(),
        ..config
    };
    let refused = Bus::connect(&no_login, "tls-test").await;
    assert!(
        matches!(refused, Err(BusError::Connect { .. })),
        "no login was accepted"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_service_logs_in_with_an_nkey_seed_file() {
    let dir = std::env::temp_dir().join(format!("agentloop-nkey-{}", agentloop_bus::nuid()));
    std::fs::create_dir_all(&dir).unwrap();
    let user = nkeys::KeyPair::new_user();
    let seed_file = dir.join("router.nk");
    std::fs::write(&seed_file, format!("{}\n", user.seed().unwrap())).unwrap();
    let conf = dir.join("nkey.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{\n  users = [ {{ nkey: {} }} ]\n}}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let nats = NatsServer::start_with_config(&conf, &[]).unwrap();
    let config = BusConfig {
        url: nats.url().to_owned(),
        prefix: format!("t{}", &agentloop_bus::nuid()[20..]),
        nkey_seed_file: seed_file.display().to_string(),
        ..Default::default()
    };

    Bus::connect(&config, "nkey-test").await.unwrap();

    let stranger = nkeys::KeyPair::new_user();
    std::fs::write(&seed_file, stranger.seed().unwrap()).unwrap();
    let refused = Bus::connect(&config, "nkey-test").await;
    assert!(
        matches!(refused, Err(BusError::Connect { .. })),
        "an unknown nkey was accepted"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
