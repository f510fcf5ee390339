//! Where `leasehold dev` keeps its certificates (issue 27, finding 10): a
//! directory in a shared temporary directory could have been made, and a
//! CA planted in it, by another local user — whose CA the dev cluster
//! would then trust.
//!
//! The default is `leasehold-dev-certs-<uid>` in the system's temporary
//! directory. Whether default or `--certs-dir`, the directory is created
//! fresh with mode 0700 when it does not exist (its parents as usual);
//! when it exists it is reused only if it is a real directory (not a
//! symbolic link) owned by the user running `leasehold dev` and writable
//! by nobody else (no group or other write bit) — otherwise `leasehold
//! dev` refuses to start, naming the directory and the reason, and writes
//! nothing.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Stem of the default directory's name (`-<uid>` follows).
pub const DEV_CERTS_DIR: &str = "leasehold-dev-certs";

/// The uid this process creates files as (the owner a directory of ours
/// has): read from a file it creates, without `unsafe`.
pub fn own_uid() -> anyhow::Result<u32> {
    let probe = tempfile::tempfile().context("create a probe file in the temporary directory")?;
    Ok(probe.metadata().context("read the probe file")?.uid())
}

/// The default certificates directory of this user.
pub fn default_dir() -> anyhow::Result<PathBuf> {
    Ok(std::env::temp_dir().join(format!("{DEV_CERTS_DIR}-{}", own_uid()?)))
}

/// Why an existing directory may not be reused, if it may not: `uid` is
/// the user's, `mode` the directory's permission bits.
pub fn refusal(is_symlink: bool, is_dir: bool, owner: u32, uid: u32, mode: u32) -> Option<String> {
    if is_symlink {
        return Some("is a symbolic link".into());
    }
    if !is_dir {
        return Some("is not a directory".into());
    }
    if owner != uid {
        return Some(format!(
            "is owned by uid {owner}, not by this user (uid {uid})"
        ));
    }
    if mode & 0o022 != 0 {
        return Some(format!(
            "is writable by its group or by others (mode {:o})",
            mode & 0o7777
        ));
    }
    None
}

/// `dir` ready for the dev certificates: created 0700 if missing, else
/// checked (see the module docs).
pub fn prepare(dir: &Path) -> anyhow::Result<()> {
    let uid = own_uid()?;
    match fs::symlink_metadata(dir) {
        Ok(meta) => check_existing(dir, &meta, uid),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent)
                    .with_context(|| format!("create {}", parent.display()))?;
            }
            match fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {
                    // The umask may have cleared bits, never added: make
                    // sure of 0700 all the same.
                    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                        .with_context(|| format!("set mode 0700 on {}", dir.display()))?;
                    Ok(())
                }
                // Someone made it between the look and the create: judge
                // what is there now.
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    let meta = fs::symlink_metadata(dir)
                        .with_context(|| format!("read {}", dir.display()))?;
                    check_existing(dir, &meta, uid)
                }
                Err(error) => Err(error).with_context(|| format!("create {}", dir.display())),
            }
        }
        Err(error) => Err(error).with_context(|| format!("read {}", dir.display())),
    }
}

fn check_existing(dir: &Path, meta: &fs::Metadata, uid: u32) -> anyhow::Result<()> {
    let why = refusal(
        meta.file_type().is_symlink(),
        meta.is_dir(),
        meta.uid(),
        uid,
        meta.mode(),
    );
    if let Some(why) = why {
        bail!(
            "certificates directory {} {why}: refusing to trust a CA in it (remove it, or name \
             another with --certs-dir)",
            dir.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_own_directory_writable_by_nobody_else_is_reused() {
        assert_eq!(refusal(false, true, 1000, 1000, 0o40700), None);
        assert_eq!(refusal(false, true, 1000, 1000, 0o40755), None);
        assert!(refusal(true, false, 1000, 1000, 0o700)
            .unwrap()
            .contains("symbolic link"));
        assert!(refusal(false, false, 1000, 1000, 0o700)
            .unwrap()
            .contains("not a directory"));
        assert!(refusal(false, true, 0, 1000, 0o700)
            .unwrap()
            .contains("uid 0"));
        assert!(refusal(false, true, 1000, 1000, 0o41777)
            .unwrap()
            .contains("writable"));
        assert!(refusal(false, true, 1000, 1000, 0o40770)
            .unwrap()
            .contains("writable"));
    }

    #[test]
    fn a_missing_directory_is_created_0700_and_a_loose_one_refused() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("a/b/certs");
        prepare(&dir).unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Reused as it is.
        prepare(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let error = prepare(&dir).unwrap_err().to_string();
        assert!(
            error.contains("writable by its group or by others"),
            "{error}"
        );
        assert!(error.contains(&dir.display().to_string()), "{error}");
        let link = base.path().join("link");
        std::os::unix::fs::symlink(base.path(), &link).unwrap();
        let error = prepare(&link).unwrap_err().to_string();
        assert!(error.contains("symbolic link"), "{error}");
    }
}
