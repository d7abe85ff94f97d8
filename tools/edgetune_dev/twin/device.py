"""A device to read from: over SSH (paramiko, one connection), or a local
directory used as the device's root (a copied or mounted root file system,
and the unit tests' trees).

Both backends offer the same few read-only operations; nothing here writes to
the device. Errors reading one file are OSError (errno set where known); a
device that cannot be reached at all raises DeviceError with one line.
"""
import errno
import os
import posixpath
import shlex
import socket
import stat

DEFAULT_TIMEOUT = 15


class DeviceError(Exception):
    """A one-line, user-facing error about reaching the device (exit code 2)."""


class Device:
    """What capture reads through. Paths are absolute paths on the device."""

    label = "device"

    def read(self, path):
        """The file's bytes (following symlinks); OSError when unreadable."""
        raise NotImplementedError

    def listdir(self, path):
        raise NotImplementedError

    def readlink(self, path):
        """The raw target of a symlink; OSError (EINVAL) when ``path`` is not one."""
        raise NotImplementedError

    def realpath(self, path):
        """``path`` with every symlink resolved, as the device resolves it."""
        raise NotImplementedError

    def kind(self, path):
        """'dir', 'file', 'link' (without following the last link) or None when absent."""
        raise NotImplementedError

    def run(self, argv):
        """Run a command read-only on the device: (exit status, stdout bytes, stderr text).
        Backends without commands return exit status 127."""
        return 127, b"", "no commands on this device"

    def close(self):
        pass

    # helpers on top of the primitives
    def text(self, path):
        return self.read(path).decode("utf-8", "replace")

    def exists(self, path):
        return self.kind(path) is not None

    def isdir(self, path):
        try:
            return self.kind(self.realpath(path)) == "dir"
        except OSError:
            return False

    def sudo_read(self, path):
        """The file read as root through ``sudo -n`` (never prompts); OSError when refused."""
        status, out, err = self.run(["sudo", "-n", "cat", "--", path])
        if status != 0:
            raise OSError(errno.EACCES, "sudo -n cat failed (exit %d): %s" % (status, err.strip()[:200]))
        return out


# --------------------------------------------------------------------------
class LocalDevice(Device):
    """A directory holding a device's root. Symlinks resolve inside it, as in a
    chroot: an absolute target starts again at the directory, never at the
    machine's own /."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.label = self.root
        if not os.path.isdir(self.root):
            raise DeviceError("%s is not a directory" % self.root)

    def _resolve(self, path, follow_last=True, depth=0):
        """The device path with symlinks resolved; returns (device path, host path)."""
        if depth > 40:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
        parts = [p for p in posixpath.normpath("/" + path.lstrip("/")).split("/") if p]
        current = "/"
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            if part == "..":
                current = posixpath.dirname(current) or "/"
                continue
            candidate = posixpath.join(current, part)
            host = self._host(candidate)
            if os.path.islink(host) and (follow_last or not last):
                target = os.readlink(host)
                base = "/" if target.startswith("/") else current
                rest = "/".join(parts[index + 1:])
                joined = posixpath.join(base, target, rest) if rest else posixpath.join(base, target)
                return self._resolve(joined, follow_last, depth + 1)
            current = candidate
        return current, self._host(current)

    def _host(self, device_path):
        return os.path.join(self.root, device_path.lstrip("/"))

    def read(self, path):
        _, host = self._resolve(path)
        with open(host, "rb") as handle:
            return handle.read()

    def listdir(self, path):
        _, host = self._resolve(path)
        return sorted(os.listdir(host))

    def readlink(self, path):
        _, host = self._resolve(path, follow_last=False)
        return os.readlink(host)

    def realpath(self, path):
        return self._resolve(path)[0]

    def kind(self, path):
        try:
            _, host = self._resolve(path, follow_last=False)
            mode = os.lstat(host).st_mode
        except OSError:
            return None
        return "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "file"


# --------------------------------------------------------------------------
class UnknownHostKey(Exception):
    def __init__(self, name, key, looked_in):
        super().__init__(name)
        self.name, self.key, self.looked_in = name, key, looked_in


def _fingerprint(key):
    import base64
    import hashlib
    digest = hashlib.sha256(key.asbytes()).digest()
    return "%s SHA256:%s" % (key.get_name(), base64.b64encode(digest).decode().rstrip("="))


class SSHDevice(Device):
    """One SSH connection (paramiko): SFTP for files, exec for the few commands.

    Host keys are always checked (known_hosts of the system and the user, the
    ssh config's UserKnownHostsFile, files given here), never learned: an
    unknown or changed key refuses the connection. Authentication is by key or
    agent only; nothing prompts."""

    def __init__(self, host, user=None, port=None, identity_files=(), known_hosts=(), host_key_alias=None,
                 identities_only=None, ssh_config=None, timeout=DEFAULT_TIMEOUT):
        try:
            import paramiko
        except ImportError:
            raise DeviceError("paramiko is not installed: run `make venv` (it is in requirements.txt)") from None
        self._paramiko = paramiko
        cfg = {}
        config_path = os.path.expanduser(ssh_config or "~/.ssh/config")
        if os.path.exists(config_path):
            try:
                cfg = paramiko.SSHConfig.from_path(config_path).lookup(host)
            except Exception as exc:  # paramiko raises several kinds on a bad file
                raise DeviceError("cannot read %s: %s" % (config_path, exc)) from None
        self.hostname = cfg.get("hostname", host)
        self.port = int(port or cfg.get("port") or 22)
        self.user = user or cfg.get("user") or os.environ.get("USER") or "root"
        alias = host_key_alias or cfg.get("hostkeyalias")
        only = identities_only if identities_only is not None else cfg.get("identitiesonly", "no") == "yes"
        keys = [os.path.expanduser(k) for k in identity_files]
        keys += [os.path.expanduser(k) for k in cfg.get("identityfile", []) if os.path.exists(os.path.expanduser(k))]
        self.label = "%s@%s:%d" % (self.user, self.hostname, self.port)

        client = paramiko.SSHClient()
        looked_in = []
        for path in ["/etc/ssh/ssh_known_hosts", "~/.ssh/known_hosts"] + \
                shlex.split(cfg.get("userknownhostsfile", "")) + list(known_hosts):
            full = os.path.expanduser(path)
            if full in looked_in:
                continue
            looked_in.append(full)
            if os.path.exists(full):
                try:
                    client.load_system_host_keys(full)
                except (OSError, paramiko.SSHException) as exc:
                    raise DeviceError("cannot read known hosts file %s: %s" % (full, exc)) from None
        self._name = self.hostname if self.port == 22 else "[%s]:%d" % (self.hostname, self.port)
        if alias:
            # OpenSSH's HostKeyAlias: the key is looked up under the alias, not the address.
            known = client.get_host_keys()
            entries = client._system_host_keys.lookup(alias)
            if entries:
                for keytype, key in entries.items():
                    known.add(self._name, keytype, key)

        class Reject(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, _client, name, key):
                raise UnknownHostKey(alias or name, key, looked_in)

        client.set_missing_host_key_policy(Reject())
        what = "agent and keys %s" % (", ".join(keys) or "(default ones)") if not only else \
            "keys %s" % (", ".join(keys) or "(none given)")
        try:
            client.connect(self.hostname, port=self.port, username=self.user, key_filename=keys or None,
                           allow_agent=not only, look_for_keys=not only and not keys, timeout=timeout,
                           banner_timeout=timeout, auth_timeout=timeout)
        except UnknownHostKey as exc:
            client.close()
            raise DeviceError("%s's host key (%s) is not in known_hosts (looked in %s): check the key on the device "
                              "and add it to known_hosts (or give --known-hosts FILE); nothing was read"
                              % (exc.name, _fingerprint(exc.key), ", ".join(exc.looked_in))) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise DeviceError("%s's host key (%s) does not match known_hosts (expected %s): refusing to connect; "
                              "if the device was reinstalled, fix its known_hosts entry"
                              % (alias or self._name, _fingerprint(exc.key), _fingerprint(exc.expected_key))) from None
        except paramiko.PasswordRequiredException as exc:
            client.close()
            raise DeviceError("the key for %s needs a passphrase (%s): load it into ssh-agent" % (self.label, exc)) \
                from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise DeviceError("authentication failed for %s (tried %s): %s" % (self.label, what, exc)) from None
        except (socket.timeout, TimeoutError):
            client.close()
            raise DeviceError("cannot connect to %s:%d: timed out after %d s" % (self.hostname, self.port, timeout)) \
                from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            client.close()
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
                reason = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()}))
            raise DeviceError("cannot connect to %s:%d: %s" % (self.hostname, self.port, reason)) from None
        self.client = client
        try:
            self.sftp = client.open_sftp()
        except (paramiko.SSHException, OSError, EOFError):
            self.sftp = None   # no SFTP subsystem (dropbear): files are read with cat on the same connection

    # ---------------------------------------------------------------- files
    def read(self, path):
        if self.sftp is None:
            status, out, err = self.run(["cat", "--", path])
            if status != 0:
                raise _oserror(err, path)
            return out
        with self.sftp.open(path, "rb") as handle:
            chunks = []
            while True:
                chunk = handle.read(32768)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)

    def listdir(self, path):
        if self.sftp is None:
            status, out, err = self.run(["ls", "-1A", "--", path])
            if status != 0:
                raise _oserror(err, path)
            return sorted(out.decode("utf-8", "replace").splitlines())
        return sorted(self.sftp.listdir(path))

    def readlink(self, path):
        if self.sftp is None:
            status, out, err = self.run(["readlink", "--", path])
            if status != 0:
                raise OSError(errno.EINVAL, "not a symlink", path)
            return out.decode().strip()
        target = self.sftp.readlink(path)
        if target is None:
            raise OSError(errno.EINVAL, "not a symlink", path)
        return target

    def realpath(self, path):
        if self.sftp is None:
            status, out, err = self.run(["readlink", "-f", "--", path])
            if status != 0:
                raise _oserror(err, path)
            return out.decode().strip()
        return self.sftp.normalize(path)

    def kind(self, path):
        if self.sftp is None:
            status, out, _ = self.run(["sh", "-c", 'if [ -L "$1" ]; then echo link; elif [ -d "$1" ]; then echo dir; '
                                       'elif [ -e "$1" ]; then echo file; fi', "sh", path])
            return out.decode().strip() or None
        try:
            mode = self.sftp.lstat(path).st_mode
        except OSError:
            return None
        return "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "file"

    # ---------------------------------------------------------------- commands
    def run(self, argv, timeout=60):
        command = " ".join(shlex.quote(a) for a in argv)
        try:
            stdin, stdout, stderr = self.client.exec_command(command, timeout=timeout)
            stdin.close()
            out = stdout.read()
            err = stderr.read().decode("utf-8", "replace")
            return stdout.channel.recv_exit_status(), out, err
        except (self._paramiko.SSHException, OSError, EOFError) as exc:
            return 255, b"", "ssh exec failed: %s" % exc

    def close(self):
        if self.sftp is not None:
            self.sftp.close()
        self.client.close()


def _oserror(err, path):
    text = err.strip()
    if "No such file" in text:
        return OSError(errno.ENOENT, "No such file or directory", path)
    if "Permission denied" in text:
        return OSError(errno.EACCES, "Permission denied", path)
    return OSError(errno.EIO, text or "read failed", path)
