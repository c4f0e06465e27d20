"""Which configurations let a test process load the agent's code (`module_rules`), read as
the C library, OpenSSL and PAM read them. The verdicts on real containers are in
tests/test_verify_world.py; these are the parser's edges."""

from __future__ import annotations

import pytest

from clotho.verify.module_rules import MAX_CONFIG_BYTES, classify, problems


@pytest.mark.parametrize(
    ("path", "kind", "verdict"),
    [
        ("/usr/local/lib/libnss_x.so.2", "added", ("dpkg", "/usr/local/lib/libnss_x.so.2")),
        ("/lib/x86_64-linux-gnu/libnss_files.so.2", "changed", "tamper"),
        ("/usr/lib/x86_64-linux-gnu/gconv/gconv-modules.d/x.conf", "added", "dpkg"),
        ("/usr/lib/x86_64-linux-gnu/ossl-modules/legacy.so", "changed", "tamper"),
        ("/usr/lib/x86_64-linux-gnu/engines-3", "changed", "tamper"),  # replaced by a link
        ("/lib/x86_64-linux-gnu/security/pam_x.so", "added", "dpkg"),
        ("/etc/pkcs11/modules/x.module", "changed", "tamper"),
        ("/etc/gss/mech.d/x.conf", "added", "dpkg"),
        ("/etc/nsswitch.conf", "changed", ("nss", "/etc/nsswitch.conf")),
        ("/etc/pam.d/common-auth", "added", ("pam", "/etc/pam.d/common-auth")),
        ("/usr/lib/ssl/openssl.cnf", "changed", ("openssl", "/usr/lib/ssl/openssl.cnf")),
        ("/opt/conda/ssl/openssl.cnf", "added", ("openssl", "/opt/conda/ssl/openssl.cnf")),
        ("/etc/ssl/openssl.cnf", "removed", None),  # removing loads nothing
        ("/app/certs/req.cnf", "added", None),  # an `openssl req -config` file of the work
        ("/usr/lib/x86_64-linux-gnu/libfoo.so.1", "added", None),  # the loader's rules
        ("/usr/local/lib/python3.11/dist-packages/security/x.py", "added", None),
    ],
)
def test_classify(path: str, kind: str, verdict) -> None:
    got = classify(path, kind)
    if verdict == "tamper":
        assert isinstance(got, str) and path in got, got
    elif verdict == "dpkg":
        assert got == ("dpkg", path)
    else:
        assert got == verdict


@pytest.mark.parametrize(
    ("kind", "path", "text", "bad"),
    [
        ("nss", "/etc/nsswitch.conf", "passwd: files systemd\nhosts: files dns\n", False),
        ("nss", "/etc/nsswitch.conf", "passwd: files [NOTFOUND=return] ../../tmp/m\n", True),
        ("nss", "/etc/nsswitch.conf", "# passwd: /x\npasswd: files\n", False),
        ("nss", "/etc/nsswitch.conf", "passwd: files \\\n ../x\n", True),  # continued
        (
            "openssl",
            "/etc/ssl/openssl.cnf",
            "[p]\ndefault = d\nlegacy = l\n[l]\nactivate = 1\n",
            False,
        ),
        ("openssl", "/etc/ssl/openssl.cnf", "[c]\nmodule = /opt/p.so\n", True),
        ("openssl", "/etc/ssl/openssl.cnf", "[c]\nmod\\\nule=/opt/p.so\n", True),  # continued
        ("openssl", "/etc/ssl/openssl.cnf", "[c]\nMODULE = /opt/p.so\n", True),
        ("openssl", "/etc/ssl/openssl.cnf", "[e]\nSO_PATH = /opt/e.so\n", True),
        ("openssl", "/etc/ssl/openssl.cnf", "[i]\nengines = e\n", True),
        ("openssl", "/etc/ssl/openssl.cnf", ".include /opt/more.cnf\n", True),
        ("openssl", "/etc/ssl/openssl.cnf", ".include=/opt/more.cnf\n", True),
        ("openssl", "/etc/ssl/openssl.cnf", "# module = /opt/p.so\n", False),
        ("pam", "/etc/pam.d/other", "auth required pam_deny.so\n@include common-auth\n", False),
        ("pam", "/etc/pam.d/other", "auth optional /tmp/p.so\n", True),
        ("pam", "/etc/pam.d/other", "-auth [success=1 default=ignore] /tmp/p.so\n", True),
        ("pam", "/etc/pam.d/other", "auth [success=1 default=ignore] pam_unix.so nullok\n", False),
        ("pam", "/etc/pam.d/other", "@include /tmp/evil\n", True),
        ("pam", "/etc/pam.d/other", "auth include /tmp/evil\n", True),
        ("pam", "/etc/pam.conf", "su auth optional /tmp/p.so\n", True),
        ("pam", "/etc/pam.conf", "su auth required pam_unix.so\n", False),
    ],
)
def test_problems(kind: str, path: str, text: str, bad: bool) -> None:
    found = problems(kind, path, text)
    assert bool(found) == bad, found
    assert all(path in reason for reason in found)


def test_a_configuration_too_large_to_read_whole_is_tamper() -> None:
    text = "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1)
    assert problems("openssl", "/etc/ssl/openssl.cnf", text)
