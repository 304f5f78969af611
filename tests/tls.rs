//! Model calls over TLS, through the binary: colony reads the certificate store only on its first
//! handshake (runtime/tls.rs), and then checks the server's certificate against it as before. A
//! TLS terminator on loopback (rustls, a certificate for 127.0.0.1 signed by a CA made here with
//! `openssl`) sits in front of the fake provider.

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::styled;

/// Runs `openssl` with `args` in `dir`, failing loudly when it cannot.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (Debian's openssl package, which ca-certificates depends on)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`ca.pem`) and a server certificate for 127.0.0.1 it signed (`server.pem`, `server.key`).
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=colony test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth\n\
         basicConstraints = critical, CA:FALSE\n",
    )
    .expect("the extensions file");
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
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
}

/// Terminates TLS on a free loopback port and relays the bytes to `upstream`; returns the port.
fn terminator(dir: &Path, upstream: std::net::SocketAddr) -> u16 {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .expect("server.pem")
        .collect::<Result<_, _>>()
        .expect("a certificate");
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("server.key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("the server certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr").port())
                .expect("port");
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake: nothing to relay.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
    });
    rx.recv().expect("the terminator listens")
}

const ASK: &str = r#"
local reply, err = ai.ask("hello", { provider = "openai", model = "m" })
print(reply or ("error: " .. tostring(err)))
"#;

/// The fake provider answering `reply` behind a TLS terminator, the folder holding the
/// terminator's CA (`ca.pem`), and a sandbox whose OpenAI base URL is the terminator's.
fn behind_tls(reply: &str) -> (FakeProvider, tempfile::TempDir, Sandbox) {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text(reply));
    let certs = tempfile::tempdir().expect("a temp dir");
    certificates(certs.path());
    let port = terminator(certs.path(), fake.addr());
    let sandbox = styled(&fake, "openai").env(
        "OPENAI_BASE_URL",
        &format!("https://127.0.0.1:{port}/openai/v1"),
    );
    (fake, certs, sandbox)
}

#[test]
fn a_model_call_over_tls_is_made_when_the_store_trusts_the_server() {
    let (fake, certs, sandbox) = behind_tls("over tls");
    let ca = certs.path().join("ca.pem");
    let run = sandbox
        // rustls-native-certs reads the store from here instead of /etc/ssl/certs.
        .env("SSL_CERT_FILE", ca.to_str().expect("a UTF-8 path"))
        .lua(ASK, &[])
        .ok();
    assert_eq!(run.stdout, "over tls\n");
    assert_eq!(fake.calls(), 1, "the call went through the terminator");
}

#[test]
fn a_model_call_to_a_server_the_store_does_not_trust_is_refused_naming_the_certificate() {
    let (fake, _certs, sandbox) = behind_tls("must not be read");
    // The machine's own store: it does not hold the CA made above.
    let run = sandbox.lua(ASK, &[]).ok();
    assert!(
        run.stdout.starts_with("error: ")
            && run
                .stdout
                .contains("invalid peer certificate: UnknownIssuer"),
        "the error names the certificate:\n{}",
        run.stdout
    );
    assert_eq!(fake.calls(), 0, "nothing reached the provider");
}

#[test]
fn with_no_certificate_store_a_tls_call_fails_saying_so_and_plain_http_still_works() {
    let (fake, certs, sandbox) = behind_tls("plain");
    let plain = fake.base_url("openai");
    let missing = certs.path().join("no-such-bundle.pem");
    let run = sandbox
        .env("SSL_CERT_FILE", missing.to_str().expect("a UTF-8 path"))
        .env("SSL_CERT_DIR", missing.to_str().expect("a UTF-8 path"))
        .lua(
            &format!(
                r#"{ASK}
local reply, err = ai.ask("hello", {{ provider = "openai", model = "m", base_url = "{plain}" }})
print(reply or ("error: " .. tostring(err)))
"#
            ),
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    assert!(
        lines[0].starts_with("error: ")
            && lines[0].contains("No CA certificates were loaded from the system"),
        "the TLS call names the missing store: {}",
        lines[0]
    );
    assert_eq!(lines[1], "plain", "the plain HTTP call is answered");
    assert_eq!(fake.calls(), 1);
}
