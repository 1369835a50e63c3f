"""A demo job that prints what training jobs print: a progress bar redrawn with \r, colour
codes, repeated warnings, blank lines, JSON metrics lines and a /LOGCOMMAND that hides a
secret. Run it under capture: `logcapture run -- python3 examples/train.py`."""

import json
import math
import sys
import time

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
STEPS = 40

print("\x1b[1;32mstarting training\x1b[0m on", "cpu")
print("/LOGCOMMAND {\"mode\":\"disabled\"}", flush=True)
print("API_TOKEN=not-for-the-log-4f1c2a")  # dropped: the logger is disabled here
print("/LOGCOMMAND {\"mode\":\"enabled\"}", flush=True)
for epoch in range(1, EPOCHS + 1):
    for step in range(STEPS + 1):
        done = int(30 * step / STEPS)
        sys.stdout.write(f"\repoch {epoch}: |{'#' * done}{' ' * (30 - done)}| {step}/{STEPS}")
        sys.stdout.flush()
        time.sleep(0.005)
    print()
    for _ in range(5):
        print("warning: learning rate schedule is constant")
    print("\n\n\n")
    loss = 2.5 * math.exp(-epoch / 2)
    print(json.dumps({"epoch": epoch, "loss": round(loss, 4), "acc": round(1 - loss / 3, 4)}))
print("done")
