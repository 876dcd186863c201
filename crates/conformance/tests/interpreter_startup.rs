//! The embedded interpreter takes its standard library and packages from
//! the environment the binary was built against, whatever Python is first
//! on `PATH` and whatever `PYTHONHOME` / `PYTHONPATH` say.
//!
//! Each test starts the real binary (the oracle starts, one case runs) in a
//! cleared environment. `--seed 1` keeps the snapshot gate out of it: only
//! start-up and the case's own verdict decide the exit code.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CASE: &str = "smoke/quantized-matmul/affine-4b-gs64/bf16/M8";

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "conformance-interpreter-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Another installation of the CPython minor the binary links (3.11, 3.12
/// or 3.13), as the interpreter's prefix search sees one:
/// `<dir>/bin/python3` (a script that fails if run) next to a
/// `lib/python3.X/` whose `os.py` is the landmark of a standard library
/// but whose modules raise. A distribution's `/usr/bin/python3` with
/// `/usr/lib/python3.X` first on PATH has this shape.
fn fake_python(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    let lib = dir
        .join("lib")
        .join(oracle::interpreter::python_lib_dir_name());
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(lib.join("encodings")).unwrap();
    let python = bin.join("python3");
    std::fs::write(
        &python,
        "#!/bin/sh\necho 'fake python3 must not be used' >&2\nexit 1\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let poison = "raise ImportError('standard library taken from the fake python on PATH')\n";
    for module in ["os.py", "encodings/__init__.py", "site.py", "numpy.py"] {
        std::fs::write(lib.join(module), poison).unwrap();
    }
    bin
}

fn run(tag: &str, envs: &[(&str, &Path)]) -> (Output, String) {
    let out_dir = scratch(tag).join("reports");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_conformance"));
    cmd.args([
        "--device",
        "cpu",
        "--seed",
        "1",
        "--filter",
        CASE,
        "--out",
        out_dir.to_str().unwrap(),
    ])
    .env_clear()
    .env("HOME", std::env::temp_dir());
    for (key, value) in envs {
        cmd.env(key, value);
    }
    let out = cmd.output().expect("the conformance binary starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

#[test]
fn another_python_first_on_path_is_not_used() {
    let dir = scratch("path");
    let bin = fake_python(&dir.join("fake"));
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display());
    let (out, text) = run("path-run", &[("PATH", Path::new(&path))]);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
fn pythonhome_and_pythonpath_cannot_inject_a_standard_library() {
    let dir = scratch("env");
    let fake = dir.join("fake");
    fake_python(&fake);
    let (out, text) = run(
        "env-run",
        &[
            ("PATH", Path::new("/usr/bin:/bin")),
            ("PYTHONHOME", &fake),
            (
                "PYTHONPATH",
                &fake
                    .join("lib")
                    .join(oracle::interpreter::python_lib_dir_name()),
            ),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
fn a_bundle_home_without_a_standard_library_is_refused_by_name() {
    let dir = scratch("bundle");
    let (out, text) = run(
        "bundle-run",
        &[
            ("PATH", Path::new("/usr/bin:/bin")),
            ("MLX_CONFORMANCE_HOME", &dir),
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&dir.display().to_string()) && text.contains("cargo xtask bundle"),
        "{text}"
    );
}
