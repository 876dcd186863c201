//! The reference environment's fingerprint and the lock it was built from.

use conformance::home::Home;

pub struct Fingerprint {
    pub lock_sha256: String,
}

pub fn read_fingerprint(home: &Home) -> Result<Fingerprint, String> {
    let path = home.fingerprint();
    let text = std::fs::read_to_string(&path).map_err(|_| {
        format!(
            "reference environment missing ({} not found); {}",
            path.display(),
            home.setup_fix()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is malformed ({e}); {}",
            path.display(),
            if home.bundle {
                home.setup_fix()
            } else {
                "run `cargo xtask setup --force`".to_owned()
            }
        )
    })?;
    let lock = v
        .get("lock_sha256")
        .and_then(|x| x.as_str())
        .unwrap_or_default()
        .to_owned();
    Ok(Fingerprint { lock_sha256: lock })
}

pub fn check_lock(home: &Home, fingerprint: &Fingerprint) -> Result<(), String> {
    use sha2::Digest;
    let lock = std::fs::read(home.lock())
        .map_err(|e| format!("cannot read the lock {}: {e}", home.lock().display()))?;
    let now = format!("{:x}", sha2::Sha256::digest(lock));
    if now != fingerprint.lock_sha256 {
        return Err(format!(
            "the reference environment was built from lock {} but {} is {now}; {}",
            fingerprint.lock_sha256,
            home.lock_display(),
            home.setup_fix()
        ));
    }
    Ok(())
}
