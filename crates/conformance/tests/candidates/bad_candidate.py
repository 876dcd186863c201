"""A candidate that misbehaves in one way (argv[1]), for tests/candidate.rs:
each way a candidate can break the protocol must end one case as a clear
row, never the run.

    crash        exits with status 9 on its first call
    hang         never answers a call
    malformed    answers a call with a line that is not JSON
    wrong-dtype  answers the reference's array as float32
    wrong-shape  answers the array without its last element
    unsupported  implements no op
    raises       raises on every call (the reference computes)
    stray-stdout prints to stdout before answering (not the protocol)
"""

import json
import sys
import time

import mlx.core as mx

MODE = sys.argv[1]


def say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    if request["type"] == "hello":
        ops = {} if MODE == "unsupported" else {"rope2d_apply": 1}
        say({"type": "hello", "protocol": 1, "name": f"bad-{MODE}", "ops": ops})
        continue
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
    if MODE == "raises":
        say({"type": "error", "id": request["id"], "kind": "raised",
             "message": "ValueError: this candidate refuses everything"})
        continue
    arrays = mx.load(request["inputs"])
    x = arrays["inputs"]
    if MODE == "wrong-dtype":
        y = x.astype(mx.float32)
    else:  # wrong-shape
        y = x.flatten()[:-1]
    mx.save_safetensors(request["outputs"], {"value": y})
    say({"type": "result", "id": request["id"], "value": {"$tensor": "value"}})
