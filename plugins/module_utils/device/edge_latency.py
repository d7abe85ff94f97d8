# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Request latency against an HTTP inference endpoint, measured where it runs
(on the device for the deploy gate). Python 3.8+, stdlib only.

Percentiles use the nearest-rank method (the value at rank ceil(p/100 * n)),
the same as tools/edgetune/bench.py, so the gate and the bench report the
same numbers for the same samples.
"""

import http.client
import json
import math
import threading
import time


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list (p in (0, 100])."""
    if not sorted_values:
        return None
    rank = max(1, int(math.ceil(p / 100.0 * len(sorted_values))))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(samples_ms, errors, duration_s):
    values = sorted(samples_ms)
    out = {"count": len(values), "errors": errors, "duration_s": round(duration_s, 3),
           "qps": round(len(values) / duration_s, 2) if duration_s > 0 else None}
    for name, p in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99)):
        value = percentile(values, p)
        out[name] = round(value, 3) if value is not None else None
    out["max_ms"] = round(values[-1], 3) if values else None
    out["mean_ms"] = round(sum(values) / len(values), 3) if values else None
    return out


def request_once(conn, path, body, headers):
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    return response.status, data


def run_load(host, port, path="/infer", body=None, requests=200, concurrency=1, warmup=10, timeout=10.0,
             keep_samples=False):
    """Send ``warmup`` then ``requests`` POSTs over ``concurrency`` keep-alive connections.

    Returns summarize() plus ``first_error`` (status and body of the first failure) and, with
    ``keep_samples``, ``samples_ms`` in completion order.
    """
    body = body if body is not None else json.dumps({"sample": 0}).encode()
    headers = {"Content-Type": "application/json", "Connection": "keep-alive"}
    lock = threading.Lock()
    state = {"next": 0, "errors": 0, "first_error": None, "start": None, "end": None}
    samples = []

    def take():
        with lock:
            if state["next"] >= warmup + requests:
                return None
            state["next"] += 1
            return state["next"] - 1

    def worker():
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            while True:
                index = take()
                if index is None:
                    return
                began = time.perf_counter()
                try:
                    status, data = request_once(conn, path, body, headers)
                except (OSError, http.client.HTTPException) as exc:
                    status, data = None, str(exc).encode()
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
                elapsed = (time.perf_counter() - began) * 1000.0
                if index < warmup:
                    continue
                with lock:
                    state["start"] = began if state["start"] is None else min(state["start"], began)
                    state["end"] = max(state["end"] or 0.0, began + elapsed / 1000.0)
                    if status == 200:
                        samples.append(elapsed)
                    else:
                        state["errors"] += 1
                        if state["first_error"] is None:
                            state["first_error"] = "%s %s" % (status, data[:200].decode("utf-8", "replace"))
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, name="edge-load-%d" % i) for i in range(max(1, concurrency))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # QPS over the measured requests: from the first one sent to the last one answered.
    duration = (state["end"] - state["start"]) if state["start"] is not None else 0.0
    result = summarize(samples, state["errors"], duration)
    result["first_error"] = state["first_error"]
    if keep_samples:
        result["samples_ms"] = [round(s, 3) for s in samples]
    return result
