# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU list helpers in the kernel's formats (Python 3.8+, stdlib only).

The kernel prints CPU sets as lists (``0-3,6``) in most sysfs and procfs files
and as hex masks (``ff``, ``00000fff``, comma separated 32-bit words on big
systems) in ``smp_affinity``.  Every role and module reads and writes sets
through these functions so that ranges, masks and validation behave the same
everywhere.
"""

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput


def parse_cpulist(text):
    """'0-3,6,8-11:2' -> [0, 1, 2, 3, 6, 8, 10].  Empty text -> [].

    Accepts the kernel's stride form ``a-b:step``.  Raises ValueError with
    the offending part on anything else.
    """
    cpus = set()
    text = (text or "").strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                span, _sep, step = part.partition(":")
                first, last = (int(x) for x in span.split("-", 1))
                stride = int(step) if step else 1
                if first > last or stride < 1 or first < 0:
                    raise ValueError
                cpus.update(range(first, last + 1, stride))
            else:
                value = int(part)
                if value < 0:
                    raise ValueError
                cpus.add(value)
        except ValueError:
            raise BadInput("invalid CPU list item %r in %r" % (part, text)) from None
    return sorted(cpus)


def format_cpulist(cpus):
    """[0, 1, 2, 3, 6] -> '0-3,6' (the kernel's own compact form)."""
    cpus = sorted(set(cpus))
    out = []
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else "%d-%d" % (cpus[i], cpus[j]))
        i = j + 1
    return ",".join(out)


def parse_cpumask(text):
    """'00000f0f' or 'ff,00000000' (32-bit words, most significant first) -> CPU list."""
    words = (text or "").strip().split(",")
    try:
        value = 0
        for word in words:
            value = (value << 32) | int(word, 16)
    except ValueError:
        raise BadInput("invalid CPU mask %r" % text) from None
    return [bit for bit in range(value.bit_length()) if value >> bit & 1]


def format_cpumask(cpus, ncpus):
    """CPU list -> the kernel's mask text for a system of ncpus CPUs."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    digits = max(1, (ncpus + 3) // 4)
    text = format(value, "0%dx" % digits)
    # The kernel separates 32-bit words with commas.
    words = []
    while len(text) > 8:
        words.insert(0, text[-8:])
        text = text[:-8]
    return ",".join([text] + words)
