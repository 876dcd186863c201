"""An independent port of four ops, written against `mlx.core` alone, served
through the conformance suite's candidate protocol (docs/src/guide/candidate.md;
the ops' signatures are in docs/ops.md).

It imports nothing of mlx.nn, mlx-lm, mlx-vlm or mlx-optiq: each op is the
arithmetic of the reference function, re-written here, as a team porting the
layers into its own engine would write it.

    quantized_linear         mlx.nn.QuantizedLinear.__call__
    quantized_switch_linear  mlx_lm QuantizedSwitchLinear.__call__ as SwitchGLU drives it
    mrope_apply              mlx_vlm Qwen3.5 MRoPERotaryEmbedding.apply_rotary (pure-MLX path)
    rope2d_apply             mlx-optiq gemma4 vision apply_multidimensional_rope

`--wrong` is a deliberately wrong variant with one rounding moved: the 2-D
RoPE rotation `x*cos + rotate_half(x)*sin` is computed in float32 and
rounded once at the end, where the reference rounds each product and the
sum in the inputs' dtype. It agrees in float32 and differs in bfloat16.

`--observable-only` returns only the layer's results, leaving out the
intermediates docs/ops.md marks *internal* (mrope_apply's `inv_freq`,
`position_selector` and `path`): the suite then compares `q` and `k` and
says what it did not compare.

Usage: conformance --candidate "python3 candidates/python/mlx_core_candidate.py"
(any Python with mlx.core of the pinned version).
"""

import json
import sys

import mlx.core as mx

WRONG = "--wrong" in sys.argv[1:]
OBSERVABLE_ONLY = "--observable-only" in sys.argv[1:]
PROTOCOL = 1


# --- the ops ---------------------------------------------------------------

def quantized_linear(x, weight, scales, biases, bias, mode, bits, group_size):
    y = mx.quantized_matmul(x, weight, scales=scales, biases=biases, transpose=True,
                            group_size=group_size, bits=bits, mode=mode)
    if bias is not None:
        y = y + bias
    return y


def quantized_switch_linear(x, indices, weight, scales, biases, bias, mode, bits, group_size,
                            sort, expert0_views=False):
    # expert0_views only changes how the reference holds the weights (views
    # of expert 0), not their values.
    def project(x, idx, sorted_indices):
        y = mx.gather_qmm(x, weight, scales, biases, rhs_indices=idx, transpose=True,
                          group_size=group_size, bits=bits, mode=mode,
                          sorted_indices=sorted_indices)
        if bias is not None:
            y = y + mx.expand_dims(bias[idx], -2)
        return y

    x = mx.expand_dims(x, (-2, -3))
    if sort:
        m = indices.shape[-1]
        flat = indices.flatten()
        order = mx.argsort(flat)
        inverse = mx.argsort(order)
        y = project(x.flatten(0, -3)[order // m], flat[order], True)
        y = mx.unflatten(y[inverse], 0, indices.shape)
    else:
        y = project(x, indices, False)
    return y.squeeze(-2)


def _inv_freq(dim, base):
    return 1.0 / (base ** (mx.arange(0, dim, 2).astype(mx.float32) / dim))


def _interleaved_selector(section, freq_dim):
    selector = [0] * freq_dim
    for axis, offset in ((1, 1), (2, 2)):
        for i in range(offset, min(section[axis] * 3, freq_dim), 3):
            selector[i] = axis
    return mx.array(selector, dtype=mx.int32)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)


@mx.compile
def _frequencies(position_ids, inv_freq, selector):
    positions = mx.take(position_ids, selector, axis=0).transpose(1, 2, 0)
    return positions.astype(mx.float32) * inv_freq


@mx.compile
def _rotate(q, k, cos, sin):
    cos = mx.expand_dims(cos, 1)
    sin = mx.expand_dims(sin, 1)
    d = cos.shape[-1]
    out = []
    for x in (q, k):
        x_rot, x_pass = x[..., :d], x[..., d:]
        embed = (x_rot * cos + _rotate_half(x_rot) * sin).astype(x.dtype)
        out.append(mx.concatenate([embed, x_pass], axis=-1))
    return out


def mrope_apply(q, k, position_ids, head_dim, partial_rotary_factor, rope_theta, mrope_section,
                path):
    if path != "pure-mlx":
        raise Unsupported(f"only the pure-MLX path (this run's reference takes {path})")
    rotary_dim = int(head_dim * partial_rotary_factor)
    inv_freq = _inv_freq(rotary_dim, rope_theta)
    selector = _interleaved_selector(list(mrope_section), inv_freq.shape[0])
    if position_ids.ndim == 2:
        freqs = mx.expand_dims(position_ids.astype(mx.float32), -1) * inv_freq
    else:
        freqs = _frequencies(position_ids, inv_freq, selector)
    emb = mx.concatenate([freqs, freqs], axis=-1)
    cos = (mx.cos(emb) * 1.0).astype(k.dtype)
    sin = (mx.sin(emb) * 1.0).astype(k.dtype)
    q_out, k_out = _rotate(q, k, cos, sin)
    if OBSERVABLE_ONLY:
        return {"q": q_out, "k": k_out}
    return {"q": q_out, "k": k_out, "path": "pure-mlx", "inv_freq": inv_freq,
            "position_selector": selector}


def rope2d_apply(inputs, positions, base_frequency):
    head_dim = inputs.shape[-1]

    def rotate(x, cos, sin):
        if WRONG:
            # The one rounding moved: products and sum in float32, rounded
            # once, where the reference rounds each in the inputs' dtype.
            f32 = mx.float32
            y = x.astype(f32) * cos.astype(f32) + _rotate_half(x).astype(f32) * sin.astype(f32)
            return y.astype(x.dtype)
        return x * cos + _rotate_half(x) * sin

    def tables(pos, channels):
        half = channels // 2
        exponents = (2.0 / channels) * mx.arange(0, half).astype(mx.float32)
        angle = pos.astype(mx.float32) / mx.power(base_frequency, exponents)
        cos = mx.concatenate([mx.cos(angle)] * 2, axis=-1).astype(inputs.dtype)
        sin = mx.concatenate([mx.sin(angle)] * 2, axis=-1).astype(inputs.dtype)
        return mx.expand_dims(cos, 2), mx.expand_dims(sin, 2)

    if positions.ndim == 2:
        cos, sin = tables(positions[..., None], head_dim)
        return rotate(inputs, cos, sin)
    ndim = positions.shape[-1]
    channels = 2 * (head_dim // (2 * ndim))
    parts = []
    for d in range(ndim):
        x = inputs[..., d * channels:(d + 1) * channels]
        cos, sin = tables(positions[..., d:d + 1], channels)
        parts.append(rotate(x, cos, sin))
    return mx.concatenate(parts, axis=-1)


OPS = {
    "quantized_linear": (1, quantized_linear),
    "quantized_switch_linear": (1, quantized_switch_linear),
    "mrope_apply": (1, mrope_apply),
    "rope2d_apply": (1, rope2d_apply),
}


class Unsupported(Exception):
    """This candidate does not do what the call asks (an `unsupported` reply)."""


# --- the protocol: line-JSON on stdin/stdout, arrays in safetensors --------

def decode(tree, arrays):
    if isinstance(tree, list):
        return [decode(t, arrays) for t in tree]
    if isinstance(tree, dict):
        if set(tree) == {"$tensor"}:
            return arrays[tree["$tensor"]]
        if set(tree) == {"$float"}:
            return float(tree["$float"])
        return {k: decode(v, arrays) for k, v in tree.items()}
    return tree


def encode(value, key, arrays):
    if isinstance(value, mx.array):
        arrays[key] = value
        return {"$tensor": key}
    if isinstance(value, (list, tuple)):
        return [encode(v, f"{key}/{i}", arrays) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: encode(v, k if key == "value" else f"{key}/{k}", arrays)
                for k, v in value.items()}
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return {"$float": str(value)}
    return value


def loaded_libmlx():
    """The libmlx file this process mapped (Linux; None elsewhere): the
    hello names it, and the runner refuses one that is not the pinned build."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if path.rsplit("/", 1)[-1].startswith("libmlx."):
                    return path
    except OSError:
        pass
    return None


def answer(out, message):
    out.write(json.dumps(message) + "\n")
    out.flush()


def main():
    # The protocol owns stdout; anything else printed goes to stderr.
    out = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        if request["type"] == "hello":
            mx.set_default_device(mx.cpu if request["backend"] == "cpu" else mx.gpu)
            name = "mlx-core-candidate" + ("-wrong" if WRONG else "")
            answer(out, {"type": "hello", "protocol": PROTOCOL, "name": name,
                         "ops": {op: v for op, (v, _) in OPS.items()},
                         "libmlx": loaded_libmlx()})
            continue
        call_id = request["id"]
        version, fn = OPS.get(request["op"], (None, None))
        if fn is None or version != request["version"]:
            answer(out, {"type": "error", "id": call_id, "kind": "unsupported",
                         "message": f"op {request['op']} v{request['version']}"})
            continue
        arrays = mx.load(request["inputs"])
        args = decode(request["args"], arrays)
        try:
            result = fn(**args)
        except Unsupported as e:
            answer(out, {"type": "error", "id": call_id, "kind": "unsupported", "message": str(e)})
            continue
        except Exception as e:  # the reference may raise too: a refusal
            answer(out, {"type": "error", "id": call_id, "kind": "raised",
                         "message": f"{type(e).__name__}: {e}"})
            continue
        produced = {}
        tree = encode(result, "value", produced)
        if produced:
            mx.save_safetensors(request["outputs"], produced)
        answer(out, {"type": "result", "id": call_id, "value": tree})


if __name__ == "__main__":
    main()
