"""The reference engine: a small multilayer perceptron run in pure Python.

Engine file format ``edgetune-mlp-json/1`` (one JSON document):

    {"format": "edgetune-mlp-json/1", "name": "...", "version": "...",
     "input": {"size": 256, "scale": 16},
     "layers": [{"in": 256, "out": 256, "activation": "relu" | "none",
                 "weight_scale": 64, "bias_scale": 256,
                 "weights": "<base64 of in*out signed bytes, row-major, one row per output>",
                 "bias": "<base64 of out signed bytes>"}, ...],
     "labels": ["...", ...],
     "golden": [{"sample": 0, "logits": [...], "class": 3}, ...]}

Weights and biases are small integers divided by a power of two, and inputs are
integers divided by a power of two, so every product and partial sum of the
forward pass is exactly representable in a double: the logits do not depend on
the order of the additions, and any correct implementation (this one, numpy,
exact fractions) gives bit-identical logits. The ``golden`` entries, computed
by the packager with exact fractions, are checked at warm-up.

Python 3.8+, standard library only: the device twins have no numpy.
"""
import base64
import json
import math
import os
from array import array
from operator import mul

FORMAT = "edgetune-mlp-json/1"
SAMPLE_MIN, SAMPLE_MAX = -16, 16


class EngineError(Exception):
    """The engine file is missing, malformed or gives wrong results."""


def xorshift32(seed):
    """Deterministic integer stream (Marsaglia xorshift32), the same on every Python."""
    state = (seed * 2654435761 + 1) & 0xFFFFFFFF or 1
    while True:
        state ^= (state << 13) & 0xFFFFFFFF
        state ^= state >> 17
        state ^= (state << 5) & 0xFFFFFFFF
        yield state


def sample_ints(seed, size):
    """The integer input vector number ``seed``: values in [-16, 16]."""
    stream = xorshift32(0x5EED0000 + seed)
    span = SAMPLE_MAX - SAMPLE_MIN + 1
    return [SAMPLE_MIN + next(stream) % span for _ in range(size)]


def _signed_bytes(text, count, what):
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, AttributeError) as exc:
        raise EngineError("%s: not base64 (%s)" % (what, exc)) from None
    if len(raw) != count:
        raise EngineError("%s: %d values, expected %d" % (what, len(raw), count))
    return array("b", raw)


def resolve_engine_path(path):
    if not os.path.isdir(path):
        return path
    manifest = os.path.join(path, "MANIFEST.json")
    try:
        with open(manifest, "r", encoding="utf-8") as handle:
            entry = json.load(handle)["entry"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineError("%s is a directory without a readable MANIFEST.json entry (%s)" % (path, exc)) from None
    if not isinstance(entry, str) or entry.startswith("/") or ".." in entry.split("/"):
        raise EngineError("%s: MANIFEST.json entry %r is not a file inside the engine" % (path, entry))
    return os.path.join(path, entry)


class Engine:
    """A loaded, validated engine. ``infer`` is thread-safe (read-only state)."""

    def __init__(self, doc):
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise EngineError("not an %s engine (format %r)" % (FORMAT, doc.get("format") if isinstance(doc, dict)
                                                                  else type(doc).__name__))
        try:
            self.name = str(doc["name"])
            self.version = str(doc["version"])
            self.input_size = int(doc["input"]["size"])
            self.input_scale = int(doc["input"]["scale"])
            self.labels = [str(label) for label in doc["labels"]]
            self.golden = list(doc.get("golden") or [])
            layers = doc["layers"]
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError("engine header is incomplete: %r missing or invalid" % (exc.args[0] if exc.args
                                                                                       else exc)) from None
        self.layers = []
        width = self.input_size
        for index, layer in enumerate(layers):
            what = "layer %d" % index
            try:
                n_in, n_out = int(layer["in"]), int(layer["out"])
                if n_in != width:
                    raise EngineError("%s takes %d inputs but the previous layer gives %d" % (what, n_in, width))
                w_scale, b_scale = int(layer["weight_scale"]), int(layer["bias_scale"])
                activation = layer.get("activation", "none")
                weights = _signed_bytes(layer["weights"], n_in * n_out, what + " weights")
                bias = _signed_bytes(layer["bias"], n_out, what + " bias")
            except (KeyError, TypeError, ValueError) as exc:
                raise EngineError("%s: field %s missing or invalid" % (what, exc)) from None
            if activation not in ("relu", "none"):
                raise EngineError("%s: unknown activation %r" % (what, activation))
            if w_scale <= 0 or b_scale <= 0:
                raise EngineError("%s: scales must be positive" % what)
            rows = [[v / w_scale for v in weights[r * n_in:(r + 1) * n_in]] for r in range(n_out)]
            self.layers.append((rows, [v / b_scale for v in bias], activation == "relu"))
            width = n_out
        if not self.layers:
            raise EngineError("the engine has no layers")
        if width != len(self.labels):
            raise EngineError("the last layer gives %d outputs but %d labels are listed" % (width, len(self.labels)))
        self.output_size = width
        self.macs = sum(len(rows) * len(rows[0]) for rows, _, _ in self.layers)

    @classmethod
    def load(cls, path):
        """Load an engine file, or an unpacked engine artifact (a directory whose
        MANIFEST.json names the file in "entry")."""
        path = resolve_engine_path(path)
        try:
            with open(path, "r", encoding="utf-8") as handle:
                doc = json.load(handle)
        except OSError as exc:
            raise EngineError("cannot read engine %s: %s" % (path, exc.strerror or exc)) from None
        except ValueError as exc:
            raise EngineError("engine %s is not valid JSON: %s" % (path, exc)) from None
        return cls(doc)

    def sample(self, seed):
        """Input vector number ``seed`` (floats), the one the golden entries use."""
        return [v / self.input_scale for v in sample_ints(seed, self.input_size)]

    def infer(self, vector):
        """Forward pass: returns the logits (list of floats)."""
        if len(vector) != self.input_size:
            raise ValueError("input has %d values, the engine takes %d" % (len(vector), self.input_size))
        x = [float(v) for v in vector]
        for rows, bias, relu in self.layers:
            y = [sum(map(mul, row, x)) + b for row, b in zip(rows, bias)]
            x = [v if v > 0.0 else 0.0 for v in y] if relu else y
        return x

    @staticmethod
    def softmax(logits):
        top = max(logits)
        exps = [math.exp(v - top) for v in logits]
        total = sum(exps)
        return [e / total for e in exps]

    def classify(self, logits):
        best = max(range(len(logits)), key=lambda i: (logits[i], -i))
        return best, self.labels[best]

    def self_test(self):
        """Run the golden samples; raises EngineError on any difference. Returns the count."""
        if not self.golden:
            raise EngineError("the engine carries no golden results to check a warm-up against")
        for entry in self.golden:
            logits = self.infer(self.sample(int(entry["sample"])))
            expected = [float(v) for v in entry["logits"]]
            if logits != expected:
                worst = max(abs(a - b) for a, b in zip(logits, expected))
                raise EngineError("warm-up on sample %s gave logits off by up to %g from the golden result"
                                  % (entry["sample"], worst))
            if self.classify(logits)[0] != int(entry["class"]):
                raise EngineError("warm-up on sample %s gave class %d, golden %s"
                                  % (entry["sample"], self.classify(logits)[0], entry["class"]))
        return len(self.golden)
