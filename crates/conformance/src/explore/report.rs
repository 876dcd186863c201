//! What a search leaves: `explore.json` (every sample and violation),
//! `explore.md` (violations, then the regime map), a standalone
//! `mlx.core`-only reproducer per violation, and kept cases
//! (`fixtures/explore/kept.json`, loaded by the registry as must-equal
//! cases named `kept/…`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::json;

use super::{Description, Found, Search};
use crate::families::quantized::linear::Bias;

/// Removes an earlier search's reports from `dir` (a directory the
/// explorer claimed: [`crate::outdir::claim`]): `explore.json`,
/// `explore.md` and the whole of `repro/`, so no reproducer of an older
/// search stands beside a new report.
pub fn clear(dir: &Path) {
    for stale in ["explore.json", "explore.md"] {
        let _ = std::fs::remove_file(dir.join(stale));
    }
    let repro = dir.join("repro");
    if std::fs::symlink_metadata(&repro).is_ok_and(|m| m.is_dir()) {
        let _ = std::fs::remove_dir_all(&repro);
    } else {
        let _ = std::fs::remove_file(&repro);
    }
}

/// Writes `explore.json`, `explore.md` and `repro/` under `dir` (an
/// earlier search's reports there removed first).
pub fn write(dir: &Path, search: &Search) -> Result<(), String> {
    let fail = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    clear(dir);
    std::fs::create_dir_all(dir.join("repro")).map_err(|e| fail(dir, e))?;
    for (i, f) in search.found.iter().enumerate() {
        reproducer(&dir.join("repro"), i, f)?;
    }
    let json = serde_json::to_string_pretty(search).expect("a search serialises");
    write_file(&dir.join("explore.json"), &json)?;
    write_file(&dir.join("explore.md"), &markdown(search))
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The regime map: per kernel class, where the bits or the batched/rows
/// invariance change, as lists of points (`Description::mkn`).
fn markdown(search: &Search) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Shape explorer\n\nseed {} · shard {}/{} · backend {} · families {} · {} samples in {:.1} s · {} violations\n",
        search.seed,
        search.shard.0,
        search.shard.1,
        search.backend,
        search.families.join(", "),
        search.samples.len(),
        search.wall_s,
        search.found.len()
    );
    let _ = writeln!(md, "## Violations (shrunk)\n");
    if search.found.is_empty() {
        let _ = writeln!(md, "None.\n");
    }
    for (i, f) in search.found.iter().enumerate() {
        let _ = writeln!(
            md,
            "{i}. **{:?}** `{}` (from `{}`, {} shrink steps): {}; exact oracle: {}; reproducer `repro/{i}.py`",
            f.kind,
            f.minimal.name("explore"),
            f.original.name("explore"),
            f.shrink_steps,
            f.seen(),
            f.observation
                .exact
                .map_or("not in scope", |c| c.word()),
        );
        if !f.preceded_by.is_empty() {
            let _ = writeln!(md, "   - ran after: {}", f.preceded_by.join(", "));
        }
        match &f.alone {
            Some(a) if a.shows => {
                let _ = writeln!(md, "   - alone in a fresh process: shows too (it does not depend on what ran before)");
            }
            Some(_) => {
                let _ = writeln!(md, "   - alone in a fresh process: does NOT show; it misbehaves only in sequence, after the samples above");
            }
            None => {
                let _ = writeln!(md, "   - alone in a fresh process: not rerun");
            }
        }
        for e in &f.extent {
            let list = |v: &[usize]| {
                if v.is_empty() {
                    "none".to_owned()
                } else {
                    v.iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            };
            let _ = writeln!(
                md,
                "   - extent in {}: shows at {}; clean at {}",
                e.axis,
                list(&e.shows),
                list(&e.clean)
            );
        }
    }
    let _ = writeln!(
        md,
        "\n## Regime map\n\nPer kernel class: samples, and the points where port and reference bits differ, where a side leaves the exact bound, and where an invariance of the port parts (a finding). A point is M×K×N for the quantized families (switch: M is the routed rows), B×L×M (requests × KV length × query rows) for attention/sdpa, and B×L×R (rows × window tokens × rotary_dim) for position/mrope.\n\n| class | samples | first use, ms | typical, ms | bits differ at | outside the bound at | invariances that part, at |\n|---|---:|---:|---:|---|---|---|"
    );
    let mut classes: BTreeMap<String, Vec<&super::Sampled>> = BTreeMap::new();
    for s in &search.samples {
        classes
            .entry(s.description.kernel_class())
            .or_default()
            .push(s);
    }
    let list = |v: Vec<(usize, usize, usize)>| -> String {
        if v.is_empty() {
            return "—".into();
        }
        let mut v = v;
        v.sort();
        v.dedup();
        v.iter()
            .take(12)
            .map(|(m, k, n)| format!("{m}×{k}×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
            + if v.len() > 12 { ", …" } else { "" }
    };
    for (class, mut samples) in classes {
        // The first sample of a class in the process carries its kernels'
        // compilation (GPU); the median of the others is the run time.
        samples.sort_by_key(|s| s.order);
        let first = samples.first().map_or(0.0, |s| s.observation.time_ms);
        let mut rest: Vec<f64> = samples
            .iter()
            .skip(1)
            .map(|s| s.observation.time_ms)
            .collect();
        rest.sort_by(f64::total_cmp);
        let typical = rest.get(rest.len() / 2).copied().unwrap_or(first);
        let at = |f: &dyn Fn(&super::Observation) -> bool| {
            list(
                samples
                    .iter()
                    .filter(|s| f(&s.observation))
                    .map(|s| s.description.mkn())
                    .collect(),
            )
        };
        let _ = writeln!(
            md,
            "| {class} | {} | {first:.1} | {typical:.1} | {} | {} | {} |",
            samples.len(),
            at(&|o| !o.bits_equal && o.error.is_none()),
            at(&|o| o
                .exact
                .is_some_and(|c| c != crate::exactness::ExactClass::Within)),
            invariances(&samples),
        );
    }
    md
}

/// Per invariance that did not hold somewhere: `name: M×K×N, …`.
fn invariances(samples: &[&super::Sampled]) -> String {
    let mut by: BTreeMap<&str, Vec<(usize, usize, usize)>> = BTreeMap::new();
    for s in samples {
        for (name, holds) in &s.observation.invariances {
            if !holds {
                by.entry(name.as_str())
                    .or_default()
                    .push(s.description.mkn());
            }
        }
    }
    if by.is_empty() {
        return "—".into();
    }
    by.into_iter()
        .map(|(name, mut v)| {
            v.sort();
            v.dedup();
            let shown: Vec<String> = v
                .iter()
                .take(10)
                .map(|(m, k, n)| format!("{m}×{k}×{n}"))
                .collect();
            format!(
                "{name}: {}{}",
                shown.join(", "),
                if v.len() > 10 { ", …" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `repro/<i>.py` and `repro/<i>.safetensors`: the minimal description's
/// inputs, and the reference's own call on them with `mlx.core` only, to
/// attach to an upstream report.
fn reproducer(dir: &Path, i: usize, f: &Found) -> Result<(), String> {
    match &f.minimal {
        Description::QuantizedLinear { shape, seed } => {
            let inputs = shape.inputs(*seed);
            let mut tensors = vec![
                ("x".to_owned(), inputs.x.clone()),
                ("weight".to_owned(), inputs.weight.clone()),
            ];
            if let Some(b) = &inputs.bias {
                tensors.push(("bias".to_owned(), b.clone()));
            }
            crate::kept::write(dir, &i.to_string(), &tensors)?;
            let spec = shape.spec;
            let bias = if shape.bias == Bias::None {
                ""
            } else {
                "\ny = y + t[\"bias\"]"
            };
            let script = format!(
                r#""""Reproducer {i} from the MLX conformance suite's shape explorer.

What the explorer saw and the minimal description are in {i}.json (data,
printed first; nothing of them is code here).
Only mlx.core: the weight is quantized by mx.quantize, then multiplied by
mx.quantized_matmul; the float32 definition (dequantize, then matmul) is
printed beside it for comparison.
"""
import json
import os
import mlx.core as mx

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "{i}.json"), encoding="utf-8") as f:
    p = json.load(f)
print("seen:", p["seen"])
print("description:", json.dumps(p["description"]))
t = mx.load(os.path.join(here, "{i}.safetensors"))
w, scales, *biases = mx.quantize(t["weight"], group_size=p["group_size"], bits=p["bits"], mode=p["mode"])
biases = biases[0] if biases else None
x = t["x"]{view}
y = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=p["group_size"], bits=p["bits"], mode=p["mode"]){bias}
w_float = mx.dequantize(w, scales, biases, group_size=p["group_size"], bits=p["bits"], mode=p["mode"]).astype(mx.float32)
definition = t["x"].astype(mx.float32) @ w_float.T{bias32}
mx.eval(y, definition)
print("quantized_matmul:", y.dtype, y.shape)
print(y)
print("float32 definition:")
print(definition)
print("largest |y - definition|:", mx.max(mx.abs(y.astype(mx.float32) - definition)).item())
print("any NaN in y:", mx.any(mx.isnan(y)).item())
"#,
                view = match shape.x_view {
                    crate::families::quantized::linear::XView::Contiguous => "",
                    crate::families::quantized::linear::XView::Sliced => "\n# The port's layout: the first K columns of a wider array.\nx = mx.concatenate([x, mx.zeros((*x.shape[:-1], 64), x.dtype)], axis=-1)[..., : x.shape[-1]]",
                    crate::families::quantized::linear::XView::Broadcast => "\n# The port's layout: row 0 broadcast over M (stride 0).\nx = mx.broadcast_to(x[..., :1, :], x.shape)",
                },
                bias32 = if bias.is_empty() {
                    ""
                } else {
                    "\ndefinition = definition + t[\"bias\"].astype(mx.float32)"
                },
            );
            sidecar(
                dir,
                i,
                f,
                json!({"group_size": spec.group_size, "bits": spec.bits, "mode": spec.mode.to_string()}),
            )?;
            write_file(&dir.join(format!("{i}.py")), &script)
        }
        Description::QuantizedSwitch { shape, seed } => {
            crate::kept::write(dir, &i.to_string(), &shape.host_inputs(*seed))?;
            let spec = shape.spec;
            let script = format!(
                r#""""Reproducer {i} from the MLX conformance suite's shape explorer.

What the explorer saw and the minimal description are in {i}.json (data,
printed first; nothing of them is code here).
Only mlx.core: the experts' weights are quantized by mx.quantize, then one
SwitchGLU projection is run by mx.gather_qmm (unsorted indices; the case
itself sorted them: {sorted}); the float32 definition is printed beside it.
"""
import json
import os
import mlx.core as mx

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "{i}.json"), encoding="utf-8") as f:
    p = json.load(f)
print("seen:", p["seen"])
print("description:", json.dumps(p["description"]))
t = mx.load(os.path.join(here, "{i}.safetensors"))
w, scales, *biases = mx.quantize(t["weight"], group_size=p["group_size"], bits=p["bits"], mode=p["mode"])
biases = biases[0] if biases else None
x = mx.expand_dims(t["x"], (-2, -3))
y = mx.gather_qmm(x, w, scales, biases, rhs_indices=t["indices"], transpose=True, group_size=p["group_size"], bits=p["bits"], mode=p["mode"]).squeeze(-2)
w_float = mx.dequantize(w, scales, biases, group_size=p["group_size"], bits=p["bits"], mode=p["mode"]).astype(mx.float32)
definition = mx.einsum("blk,blenk->blen", t["x"].astype(mx.float32), w_float[t["indices"]])
if "bias" in t:
    y = y + t["bias"][t["indices"]]
    definition = definition + t["bias"].astype(mx.float32)[t["indices"]]
mx.eval(y, definition)
print("gather_qmm:", y.dtype, y.shape)
print(y)
print("largest |y - definition|:", mx.max(mx.abs(y.astype(mx.float32) - definition)).item())
print("any NaN in y:", mx.any(mx.isnan(y)).item())
"#,
                sorted = shape.sorted,
            );
            sidecar(
                dir,
                i,
                f,
                json!({"group_size": spec.group_size, "bits": spec.bits, "mode": spec.mode.to_string()}),
            )?;
            write_file(&dir.join(format!("{i}.py")), &script)
        }
        Description::AttentionSdpa { shape, seed } => {
            let inp = shape.inputs(*seed);
            crate::kept::write(
                dir,
                &i.to_string(),
                &[
                    ("queries".to_owned(), inp.queries),
                    ("keys".to_owned(), inp.keys),
                    ("values".to_owned(), inp.values),
                ],
            )?;
            let script = format!(
                r#""""Reproducer {i} from the MLX conformance suite's shape explorer.

What the explorer saw and the minimal description are in {i}.json (data,
printed first; nothing of them is code here).
Only mlx.core: mx.fast.scaled_dot_product_attention of the queries
[B, H, M, D] over the keys and values [B, H_kv, L, D] handed over two ways:
as one contiguous array, and as the prefix slice of a buffer grown in steps
of 256 (the layout of mlx-lm's KVCache); each request of the batch alone;
and a float32 definition (causal within the M rows when M > 1).
"""
import json
import os
import mlx.core as mx

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "{i}.json"), encoding="utf-8") as f:
    p = json.load(f)
print("seen:", p["seen"])
print("description:", json.dumps(p["description"]))
t = mx.load(os.path.join(here, "{i}.safetensors"))
q, k, v = t["queries"], t["keys"], t["values"]
B, H, M, D = q.shape
L = k.shape[2]
scale = D ** -0.5
mask = None if M == 1 else "causal"

def buffered(a):
    cap = (L + 255) // 256 * 256
    pad = mx.zeros((*a.shape[:2], cap - L, a.shape[3]), a.dtype)
    return mx.concatenate([a, pad], axis=2)[:, :, :L, :]

kb, vb = buffered(k), buffered(v)
mx.eval(k, v, kb, vb)
contiguous = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
cache_buffer = mx.fast.scaled_dot_product_attention(q, kb, vb, scale=scale, mask=mask)
alone = mx.concatenate([mx.fast.scaled_dot_product_attention(q[b:b+1], k[b:b+1], v[b:b+1], scale=scale, mask=mask) for b in range(B)], axis=0)
kf = mx.repeat(k.astype(mx.float32), H // k.shape[1], axis=1)
vf = mx.repeat(v.astype(mx.float32), H // v.shape[1], axis=1)
s = (q.astype(mx.float32) * scale) @ kf.swapaxes(-1, -2)
if M > 1:
    allowed = mx.arange(L)[None] <= (mx.arange(M)[:, None] + L - M)
    s = mx.where(allowed, s, -mx.inf)
definition = mx.softmax(s, axis=-1) @ vf
mx.eval(contiguous, cache_buffer, alone, definition)
def same(a, b):
    return bool(mx.all(a.view(mx.uint16 if a.dtype != mx.float32 else mx.uint32) == b.view(mx.uint16 if b.dtype != mx.float32 else mx.uint32)).item())
print("contiguous == cache buffer, bit for bit:", same(contiguous, cache_buffer))
print("batch == each request alone, bit for bit:", same(contiguous, alone))
for name, y in (("contiguous", contiguous), ("cache buffer", cache_buffer)):
    print(name, "largest |y - definition|:", mx.max(mx.abs(y.astype(mx.float32) - definition)).item(), "any NaN:", mx.any(mx.isnan(y)).item())
"#,
            );
            sidecar(dir, i, f, json!({}))?;
            write_file(&dir.join(format!("{i}.py")), &script)
        }
        Description::PositionMrope { shape, seed } => {
            let tensors = shape.host_inputs(*seed).map_err(|e| e.to_string())?;
            crate::kept::write(dir, &i.to_string(), &tensors)?;
            let [a, b, c] = shape.mrope_section;
            let script = format!(
                r#""""Reproducer {i} from the MLX conformance suite's shape explorer.

What the explorer saw and the minimal description are in {i}.json (data,
printed first; nothing of them is code here).
The reference's own rotary on the saved q, k and position_ids: mlx-vlm's
MRoPERotaryEmbedding built as Qwen3_5RotaryEmbedding builds it
(style="interleaved"), applied with apply_rotary. Needs mlx.core and the
mlx-vlm package on the path (its rope_utils module is loaded from its file,
so mlx-vlm's own dependencies need not be installed).
"""
import importlib.util
import json
import os
import mlx.core as mx

spec = importlib.util.find_spec("mlx_vlm")
path = os.path.join(spec.submodule_search_locations[0], "models", "rope_utils.py")
rope_utils_spec = importlib.util.spec_from_file_location("rope_utils", path)
rope_utils = importlib.util.module_from_spec(rope_utils_spec)
rope_utils_spec.loader.exec_module(rope_utils)

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "{i}.json"), encoding="utf-8") as f:
    p = json.load(f)
print("seen:", p["seen"])
print("description:", json.dumps(p["description"]))
t = mx.load(os.path.join(here, "{i}.safetensors"))
rotary = rope_utils.MRoPERotaryEmbedding(p["rotary_dim"], base=p["rope_theta"], mrope_section=p["mrope_section"], style="interleaved")
q, k = rotary.apply_rotary(t["q"], t["k"], t["position_ids"], unsqueeze_dim=1)
mx.eval(q, k)
print("rotary_dim", p["rotary_dim"], "mrope_section", p["mrope_section"], "(sum", sum(p["mrope_section"]), "; rotary_dim / 2 =", p["rotary_dim"] // 2, "frequencies)")
print("q:", q.dtype, q.shape, "any NaN:", mx.any(mx.isnan(q)).item())
print("k:", k.dtype, k.shape, "any NaN:", mx.any(mx.isnan(k)).item())
"#,
            );
            sidecar(
                dir,
                i,
                f,
                json!({"rotary_dim": shape.rotary_dim, "rope_theta": shape.rope_theta, "mrope_section": [a, b, c]}),
            )?;
            write_file(&dir.join(format!("{i}.py")), &script)
        }
    }
}

/// `repro/<i>.json`: what the reproducer reads as data (what the search
/// saw, the minimal description, the call's parameters). Nothing taken
/// from a report (a `--merge`d explore.json is anyone's file, and an MLX
/// message may hold any text) is ever written into the script itself.
fn sidecar(dir: &Path, i: usize, f: &Found, params: serde_json::Value) -> Result<(), String> {
    let mut data = json!({
        "kind": format!("{:?}", f.kind),
        "seen": format!("{:?}: {}", f.kind, f.seen()),
        "description": f.minimal,
    });
    if let (Some(d), serde_json::Value::Object(p)) = (data.as_object_mut(), params) {
        d.extend(p);
    }
    write_file(
        &dir.join(format!("{i}.json")),
        &(serde_json::to_string_pretty(&data).expect("json") + "\n"),
    )
}

pub use conformance_cases::explore::{kept_file, read_kept, Kept};

/// Adds every bit or exact-bound violation's minimal description to the
/// kept file (once each); returns how many were new. A description the
/// case cannot run (`Violation::Error`, e.g. the reference's own
/// `mx.quantize` refusing it) is reported and reproduced, not kept: as a
/// must-equal case it could only error.
pub fn keep(fixtures: &Path, search: &Search, date: &str) -> Result<usize, String> {
    let new: Vec<Kept> = search
        .found
        .iter()
        .filter(|f| f.kind != super::Violation::Error)
        .map(|f| Kept {
            description: f.minimal.clone(),
            backend: search.backend.clone(),
            date: date.to_owned(),
            seen: format!("{:?}: {}", f.kind, f.seen()),
        })
        .collect();
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        return Err(
            "--keep: kept cases are never written under CI=true; keep them locally and commit"
                .into(),
        );
    }
    update_kept(fixtures, |kept| {
        let mut added = 0;
        for k in &new {
            if !kept.iter().any(|old| old.description == k.description) {
                kept.push(k.clone());
                added += 1;
            }
        }
        added
    })
}

/// Reads the kept file, changes it with `change` and writes it back, all
/// under an exclusive lock on its directory (`flock` on the directory
/// itself): two `--keep` runs at once both keep their cases, in turn,
/// instead of the second's write dropping the first's. Returns what
/// `change` returned.
pub fn update_kept(
    fixtures: &Path,
    change: impl FnOnce(&mut Vec<Kept>) -> usize,
) -> Result<usize, String> {
    let path = kept_file(fixtures);
    let dir = path.parent().expect("has a parent");
    // Never through a link: `fixtures/explore` (or `fixtures/`) as a link
    // would carry the write outside the checkout.
    for d in [fixtures, dir] {
        if std::fs::symlink_metadata(d).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!(
                "{} is a symbolic link; kept cases are never written through one",
                d.display()
            ));
        }
    }
    if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
        return Err(format!(
            "{} is not a regular file; move it away",
            path.display()
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", path.display()))?;
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    if let Err(std::fs::TryLockError::WouldBlock) = lock.try_lock() {
        errln!(
            "note: waiting for another run that is keeping cases in {}",
            dir.display()
        );
        lock.lock().map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut kept = read_kept(fixtures)?;
    let n = change(&mut kept);
    let written = write_kept(
        &path,
        &(serde_json::to_string_pretty(&kept).expect("json") + "\n"),
    );
    drop(lock);
    written.map(|()| n)
}

/// The kept file written atomically under a name no other writer uses.
fn write_kept(path: &Path, text: &str) -> Result<(), String> {
    let dir = path.parent().expect("has a parent");
    let mut tmp = tempfile::Builder::new()
        .prefix(".kept.json.")
        .tempfile_in(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    use std::io::Write as _;
    tmp.write_all(text.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut perms = tmp
        .as_file()
        .metadata()
        .map_err(|e| e.to_string())?
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
    let _ = tmp.as_file().set_permissions(perms);
    tmp.persist(path)
        .map(|_| ())
        .map_err(|e| format!("{}: {}", path.display(), e.error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(seed: u64) -> Kept {
        serde_json::from_value(serde_json::json!({
            "description": {"family": "attention/sdpa", "shape": {"dtype": "bfloat16", "batch": 1,
                "n_heads": 2, "n_kv_heads": 1, "head_dim": 64, "kv_len": 8, "m": 1,
                "kv_view": "contiguous"}, "seed": seed},
            "backend": "cpu", "date": "2026-12-03", "seen": "test"
        }))
        .unwrap()
    }

    /// Before the lock, writers that read kept.json at once wrote it back
    /// each without the others' cases (issue 40, class 3: 2 rounds in 60
    /// lost a case); now every writer's case is there.
    #[test]
    fn concurrent_keeps_lose_no_case() {
        let root = tempfile::tempdir().unwrap();
        let fixtures = root.path().join("fixtures");
        let threads = 8;
        let rounds = 6;
        std::thread::scope(|s| {
            for t in 0..threads {
                let fixtures = &fixtures;
                s.spawn(move || {
                    for r in 0..rounds {
                        let k = kept(t * 1000 + r);
                        let n = update_kept(fixtures, |all| {
                            all.push(k);
                            1
                        })
                        .unwrap();
                        assert_eq!(n, 1);
                    }
                });
            }
        });
        let all = read_kept(&fixtures).unwrap();
        assert_eq!(all.len() as u64, threads * rounds, "no kept case lost");
        let leftovers: Vec<_> = std::fs::read_dir(fixtures.join("explore"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "kept.json")
            .collect();
        assert!(
            leftovers.is_empty(),
            "no temporary file left: {leftovers:?}"
        );
    }
}
