"""edgetune: the CLI for tuning, planning, auditing and verifying fleets of edge AI devices.

It runs the collection edgetune.fleet's playbooks as the operator's own
ansible-playbook would from the current directory, and imports the
collection's module utilities (the code the devices run too) where it needs
them, through Ansible's own collection loader, from where Ansible finds the
collection (edgetune.ansible_setup.module_utils). Importing this package
changes nothing: no path, no link, no file.
"""

__version__ = "0.3.0"
# The version of the collection edgetune.fleet this edgetune is released with (galaxy.yml's).
COLLECTION_VERSION = __version__
