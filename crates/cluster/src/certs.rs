//! `downpour certs generate`: a throw-away cluster CA and node certificates for a quick TLS
//! start (rcgen). Production clusters should use certificates from their own CA.

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use std::path::{Path, PathBuf};

/// Certificate tools.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Subcommand))]
pub enum CertsCmd {
    /// Write a new CA (`ca.pem`, `ca.key`) and `--nodes` node certificates signed by it
    /// (`node-I.pem`, `node-I.key`), each valid for localhost, 127.0.0.1, ::1 and `--hosts`.
    Generate(GenerateArgs),
}

/// Flags of `certs generate`.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct GenerateArgs {
    /// Directory to write into (created; existing certificates are not overwritten).
    #[cfg_attr(feature = "cli", arg(long))]
    pub out: PathBuf,
    /// Node certificates to make (a launch of S servers and W workers needs 1 + S + W).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 8))]
    pub nodes: usize,
    /// More names or IP addresses every node certificate is valid for (comma-separated).
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ','))]
    pub hosts: Vec<String>,
}

/// Runs a `certs` command.
pub fn run(cmd: &CertsCmd) -> Result<()> {
    match cmd {
        CertsCmd::Generate(a) => generate(a),
    }
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = o.open(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

fn write_public(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {} (remove old certificates first)", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

fn generate(a: &GenerateArgs) -> Result<()> {
    anyhow::ensure!((1..=10_000).contains(&a.nodes), "--nodes must be 1..=10000");
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "downpour cluster CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key).context("signing the CA")?;
    write_public(&a.out.join("ca.pem"), &ca_cert.pem())?;
    write_private(&a.out.join("ca.key"), &ca_key.serialize_pem())?;
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    names.extend(a.hosts.iter().map(|h| h.trim().to_string()).filter(|h| !h.is_empty()));
    for i in 0..a.nodes {
        let key = KeyPair::generate().context("generating a node key")?;
        let mut p = CertificateParams::new(names.clone()).context("a node certificate's names")?;
        p.distinguished_name.push(DnType::CommonName, format!("downpour node {i}"));
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &ca_cert, &ca_key).context("signing a node certificate")?;
        write_public(&a.out.join(format!("node-{i}.pem")), &cert.pem())?;
        write_private(&a.out.join(format!("node-{i}.key")), &key.serialize_pem())?;
    }
    println!(
        "wrote a CA and {} node certificates to {} (valid for {}); run a TLS cluster with\n  downpour launch --tls-dir {} --servers S --workers W -- JOB   (needs 1 + S + W nodes)",
        a.nodes,
        a.out.display(),
        names.join(", "),
        a.out.display()
    );
    Ok(())
}

/// The files of node `i` in a directory written by `certs generate`: (cert, key, CA), each
/// checked to exist.
pub fn node_files(dir: &Path, i: usize) -> Result<[PathBuf; 3]> {
    let f = [dir.join(format!("node-{i}.pem")), dir.join(format!("node-{i}.key")), dir.join("ca.pem")];
    for p in &f {
        anyhow::ensure!(
            p.is_file(),
            "{} is missing: the TLS directory needs a certificate per process (`downpour certs generate --out {} --nodes N`)",
            p.display(),
            dir.display()
        );
    }
    Ok(f)
}
