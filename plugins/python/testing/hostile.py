"""A Python reward that misbehaves as its `mode` parameter says (tests/plugins_python.rs):
every mode must end in a clear error naming the plugin's file and the cause, within the
sandbox's fuel, memory and time limits."""

import smallrl

MODES = [
    "none", "loop", "memory", "open", "socket", "environ", "subprocess", "exit", "os_exit", "print",
    "huge_error", "import", "nan", "wrong_length", "third_call",
]


class Hostile(smallrl.Reward):
    name = "hostile_python"
    version = "0.1.0"
    description = "misbehaves as `mode` says"
    params = [smallrl.string("mode", "none", "one of: " + ", ".join(MODES))]

    def configure(self, params):
        if params["mode"] not in MODES:
            raise ValueError(f"unknown mode {params['mode']!r}")

    calls = 0

    def score_batch(self, samples):
        mode = self.params["mode"]
        self.calls += 1
        if mode == "third_call" and self.calls == 3:
            raise RuntimeError("failing at the third call, as asked")
        if mode == "loop":
            while True:
                pass
        if mode == "memory":
            hoard = [bytearray(1 << 20) for _ in range(4096)]  # 4 GiB, a MiB at a time
            return [float(len(hoard))] * len(samples)
        if mode == "open":
            with open("/etc/passwd") as file:
                return [float(len(file.read()))] * len(samples)
        if mode == "socket":
            import socket

            socket.create_connection(("127.0.0.1", 80), timeout=1)
        if mode == "environ":
            import os

            return [float(len(os.environ["HOME"]))] * len(samples)
        if mode == "subprocess":
            import subprocess

            subprocess.run(["ls", "/"], check=True)
        if mode == "exit":
            import sys

            sys.exit(3)
        if mode == "os_exit":
            import os

            os._exit(3)
        if mode == "print":
            chunk = "x" * (1 << 20)
            for _ in range(100):
                print(chunk)
            print("printed 100 MB")
        if mode == "huge_error":
            raise ValueError("y" * (16 << 20))
        if mode == "import":
            import numpy  # noqa: F401  (not bundled)
        if mode == "nan":
            return [float("nan")] * len(samples)
        if mode == "wrong_length":
            return [0.0] * (len(samples) + 1)
        return [1.0] * len(samples)
