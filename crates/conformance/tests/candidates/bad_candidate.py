"""A candidate that misbehaves in one way (argv[1]), for tests/candidate.rs:
each way a candidate can break the protocol must end one case as a clear
row, never the run.

    crash        exits with status 9 on its first call
    hang         never answers a call
    malformed    answers a call with a line that is not JSON
    wrong-dtype  answers the reference's array as float32
    wrong-shape  answers the array without its last element
    unsupported  implements no op
    long-name    implements no op, under a name of 1 MiB
    raises       raises on every call (the reference computes)
    stray-stdout prints to stdout before answering (not the protocol)
    wrong-kind   answers an int where the reference returns an array
    nan          answers an array of NaN bits (right dtype and shape)
    noisy        writes a line that is not UTF-8 and 1 MiB with no newline
                 to stderr, then raises with a 1 MiB message
    orphans      starts a child in its group and a grandchild in a session
                 of its own, then exits (their pids to $BAD_CANDIDATE_PIDS)
    close-stdout closes its stdout and keeps running
    busy         ignores SIGTERM, starts a detached grandchild and computes
                 forever (its worker is killed at the case timeout)
    refuses-blank-policy declares a refusal whose condition is a blank,
                 then raises on every call
    control-chars writes terminal control sequences to stderr and raises
                 with a message full of them
    kill-launcher kills its launcher (SIGKILL), starts a detached child,
                 ignores SIGTERM and never answers
    other-libmlx names another file than the pinned libmlx in its hello
    empty        answers a zero-length array (shape [0], right dtype)
"""

import json
import os
import signal
import subprocess
import sys
import time

import mlx.core as mx

MODE = sys.argv[1]


def record_pids(*pids):
    path = os.environ.get("BAD_CANDIDATE_PIDS")
    if path:
        with open(path, "a") as f:
            for pid in pids:
                f.write(f"{pid}\n")


def say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    if request["type"] == "hello":
        ops = {} if MODE in ("unsupported", "long-name") else {"rope2d_apply": 1}
        name = "n" * (1 << 20) if MODE == "long-name" else f"bad-{MODE}"
        hello = {"type": "hello", "protocol": 1, "name": name, "ops": ops}
        if MODE == "other-libmlx":
            hello["libmlx"] = sys.executable
        if MODE in ("refuses-by-policy", "refuses-off-policy"):
            hello["refusals"] = [{"op": "rope2d_apply",
                                  "condition": "no 2-D RoPE on this engine"}]
        if MODE == "refuses-blank-policy":
            # A condition every message with a space "contains".
            hello["refusals"] = [{"op": "rope2d_apply", "condition": " "}]
        say(hello)
        continue
    if MODE == "orphans":
        child = subprocess.Popen(["sleep", "300"])
        detached = subprocess.Popen(["sleep", "301"], start_new_session=True)
        record_pids(os.getpid(), child.pid, detached.pid)
        sys.stderr.write("bad candidate: leaving children\n")
        sys.stderr.flush()
        os._exit(9)
    if MODE == "close-stdout":
        record_pids(os.getpid())
        os.close(1)
        time.sleep(3600)
    if MODE == "kill-launcher":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--candidate-launcher" in f.read():
                    os.kill(pid, signal.SIGKILL)
                    break
        detached = subprocess.Popen(["sleep", "303"], start_new_session=True)
        record_pids(os.getpid(), detached.pid)
        while True:
            time.sleep(1)
    if MODE == "busy":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        detached = subprocess.Popen(["sleep", "302"], start_new_session=True)
        record_pids(os.getpid(), detached.pid)
        while True:
            time.sleep(1)
    if MODE == "crash":
        sys.stderr.write("bad candidate: crashing on purpose\n")
        sys.stderr.flush()
        sys.exit(9)
    if MODE == "hang":
        time.sleep(3600)
    if MODE == "malformed":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
        continue
    if MODE == "stray-stdout":
        print("loading weights...")
        sys.stdout.flush()
    if MODE == "noisy":
        sys.stderr.buffer.write(b"\xff\xfe not utf-8\n")
        sys.stderr.buffer.write(b"x" * (1 << 20))
        sys.stderr.flush()
        say({"type": "error", "id": request["id"], "kind": "raised",
             "message": "ValueError: noisy " + "y" * (1 << 20)})
        continue
    if MODE == "refuses-by-policy":
        say({"type": "error", "id": request["id"], "kind": "raised",
             "message": "NotImplementedError: no 2-D RoPE on this engine"})
        continue
    if MODE in ("refuses-off-policy", "refuses-blank-policy"):
        say({"type": "error", "id": request["id"], "kind": "raised",
             "message": "ValueError: something else"})
        continue
    if MODE == "control-chars":
        sys.stderr.write("stderr \x1b]0;title\x07\x1b[2J\n")
        sys.stderr.flush()
        say({"type": "error", "id": request["id"], "kind": "raised",
             "message": "ValueError: \x1b]0;title\x07 \x00\x08\x1b[31mred\x1b[0m"})
        continue
    if MODE == "raises":
        say({"type": "error", "id": request["id"], "kind": "raised",
             "message": "ValueError: this candidate refuses everything"})
        continue
    if MODE == "wrong-kind":
        say({"type": "result", "id": request["id"], "value": 3})
        continue
    arrays = mx.load(request["inputs"])
    x = arrays["inputs"]
    if MODE == "nan":
        y = mx.full(x.shape, float("nan"), x.dtype)
    elif MODE == "empty":
        y = mx.zeros((0,), x.dtype)
    elif MODE == "wrong-dtype":
        y = x.astype(mx.float32)
    else:  # wrong-shape
        y = x.flatten()[:-1]
    mx.save_safetensors(request["outputs"], {"value": y})
    say({"type": "result", "id": request["id"], "value": {"$tensor": "value"}})
