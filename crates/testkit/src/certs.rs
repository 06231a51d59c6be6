//! Test certificates made with the `openssl` command: a CA and a server certificate it signed,
//! for tests of TLS between the services and NATS or memory.

use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the openssl command is needed to make test certificates");
    assert!(status.success(), "openssl {args:?} failed");
}

/// A self-signed CA named `<name>.pem` (key `<name>.key`) in `dir`; panics when openssl fails.
pub fn make_ca(dir: &Path, name: &str) {
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    let subject = format!("/CN=agentloop test {name}");
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", &subject,
            "-keyout", &key, "-out", &pem,
        ],
    );
}

/// `server.pem` and `server.key` for localhost and 127.0.0.1, signed by the CA `ca`.
pub fn make_server_certificate(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("the certificate dir is writable");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ],
    );
}
