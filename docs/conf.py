"""Sphinx configuration of the edgetune docs site (`make docs`).

The source tree Sphinx reads is .cache/docs/src, laid out by the Makefile's docs
target: a copy of this directory (mtimes kept), and reference/, the collection
reference that antsibull-docs generates from the plugins' and roles' own
documentation at each build (never committed). This file is read from here
(sphinx-build -c docs). A page of this directory that no toctree names is a warning.

Offline: no intersphinx, no theme or extension that fetches anything. A reference
to another collection's plugin (ansible.builtin.copy) or to a page of Ansible's
own docs site (common_return_values) stays plain text; every other unresolved
reference is a warning, and the build treats warnings as errors.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

project = "edgetune"
author = "edgetune maintainers"
project_copyright = "edgetune maintainers"
# The collection's version, galaxy.yml's (one source of truth; PyYAML is not needed for one key).
release = version = re.search(r"^version:\s*['\"]?([^\s'\"]+)", (ROOT / "galaxy.yml").read_text(),
                              re.MULTILINE).group(1)

extensions = ["myst_parser", "sphinx_antsibull_ext"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = []
nitpicky = True
# Anchors for the guide's headings, so that pages link to sections ([text](audit.md#exit-codes)).
myst_heading_anchors = 3
myst_enable_extensions = ["deflist"]
pygments_style = "sphinx"

html_theme = "alabaster"
html_title = "edgetune %s" % release
html_show_sourcelink = False
html_show_sphinx = False
html_copy_source = False
html_last_updated_fmt = None
html_theme_options = {"description": "Tune and audit fleets of edge AI boards", "fixed_sidebar": True}

# Labels of Ansible's own docs site that antsibull-docs' pages name (intersphinx would resolve them).
ANSIBLE_DOCSITE_LABELS = {"action_plugins", "ansible_configuration_settings", "callback_plugins",
                          "common_return_values", "lookup_plugins", "filter_plugins", "playbooks_vars_facts"}
OWN_LABELS = "ansible_collections.edgetune.fleet."


def _plain_external_ref(app, env, node, contnode):
    """Leave a reference to another collection or to Ansible's docs site as its text, with no link."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "std":
        return None
    if node.get("reftype") == "ref" and (target in ANSIBLE_DOCSITE_LABELS or (
            target.startswith("ansible_collections.") and not target.startswith(OWN_LABELS))):
        return contnode
    # ansible-core's settings (ANSIBLE_CALLBACKS_ENABLED): documented on Ansible's docs site.
    if node.get("reftype") == "envvar" and target.startswith("ANSIBLE_"):
        return contnode
    return None


def setup(app):
    app.connect("missing-reference", _plain_external_ref)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
