//! `tlaloc keygen --out PREFIX` and `tlaloc sign ARTIFACT --key K`: ed25519 keys and the
//! detached signature of an artifact's manifest (see `tlaloc_artifact::signature`). The secret
//! key file is created readable by its owner only, never overwritten, and never written into
//! an artifact: `sign` refuses a key that lies inside the artifact it signs.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use tlaloc_artifact::Artifact;
use tlaloc_artifact::signature::{PublicKey, SecretKey, sign_artifact, verify_artifact_signature};

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Writes PREFIX.secret (mode 0600) and PREFIX.pub.
    #[arg(long, value_name = "PREFIX")]
    out: PathBuf,
}

#[derive(Debug, Args)]
pub struct SignArgs {
    /// The artifact directory.
    artifact: PathBuf,
    /// The secret key file (from `tlaloc keygen`).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Creates `path` with `text`, refusing an existing file; `private` makes it owner-only.
fn create_new(path: &Path, text: &str, private: bool) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(path).with_context(|| {
        format!(
            "cannot create {} (an existing key is never overwritten)",
            path.display()
        )
    })?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

pub fn keygen(args: KeygenArgs) -> Result<()> {
    let secret_path = with_suffix(&args.out, ".secret");
    let public_path = with_suffix(&args.out, ".pub");
    for path in [&secret_path, &public_path] {
        if path.exists() {
            bail!(
                "{} exists; an existing key is never overwritten: choose another --out",
                path.display()
            );
        }
    }
    let key = SecretKey::generate()?;
    create_new(&secret_path, &key.to_file_text(), true)?;
    create_new(&public_path, &key.public_key().to_file_text(), false)?;
    println!(
        "key {}: secret {} (keep it private), public {}",
        key.public_key().id(),
        secret_path.display(),
        public_path.display()
    );
    Ok(())
}

/// Checks the signature of the artifact in `dir` under the public key file `key`; returns the
/// key's id. Shared by `verify --public-key` and `serve --require-signature`.
pub fn check_signature(dir: &Path, key: &Path) -> Result<String> {
    let key = PublicKey::read(key)?;
    verify_artifact_signature(dir, &key)
        .with_context(|| format!("refusing the artifact {}", dir.display()))?;
    Ok(key.id())
}

pub fn sign(args: SignArgs) -> Result<()> {
    let artifact = Artifact::open(&args.artifact)
        .with_context(|| format!("opening artifact {}", args.artifact.display()))?;
    let key_path = args
        .key
        .canonicalize()
        .with_context(|| format!("cannot read the key {}", args.key.display()))?;
    if key_path.starts_with(artifact.root()) {
        bail!(
            "the key {} is inside the artifact {}; keys are never shipped in an artifact: move it out",
            args.key.display(),
            artifact.root().display()
        );
    }
    let key = SecretKey::read(&key_path)?;
    // A signature vouches for the files the manifest names, so they are checked first.
    artifact
        .verify()
        .with_context(|| format!("refusing to sign {}", args.artifact.display()))?;
    let path = sign_artifact(artifact.root(), &key)?;
    println!(
        "signed {} with key {}: {}",
        args.artifact.display(),
        key.public_key().id(),
        path.display()
    );
    Ok(())
}
