"""Which configurations let a test process load the agent's code (`module_rules`), read as
the C library and PAM read them. The verdicts on real containers are in
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
        ("/tools/deps/lib/ossl-modules/evil.so", "changed", "tamper"),  # any OpenSSL's
        ("/usr/local/lib64/ossl-modules/legacy.so", "added", None),  # named by no pinned config
        ("/lib/x86_64-linux-gnu/security/pam_x.so", "added", "dpkg"),
        ("/etc/pkcs11/modules/x.module", "changed", "tamper"),
        ("/etc/gss/mech.d/x.conf", "added", "dpkg"),
        ("/usr/local/cuda/lib64/libnss_x.so.2", "added", "dpkg"),  # any folder ld.so.conf lists
        ("/app/build/libnss_x.so.2", "added", None),  # built in the workdir: the work
        ("/etc/nsswitch.conf", "changed", ("nss", "/etc/nsswitch.conf")),
        ("/etc/pam.d/common-auth", "added", ("pam", "/etc/pam.d/common-auth")),
        ("/usr/lib/pam.d/su", "added", ("pam", "/usr/lib/pam.d/su")),  # PAM's fallback
        ("/etc/ssl/openssl.cnf", "changed", None),  # the tests' libcrypto reads the image's
        ("/etc/pam.d/su", "removed", None),  # removing loads nothing
        ("/usr/lib/x86_64-linux-gnu/libfoo.so.1", "added", None),  # the loader's rules
        ("/usr/local/lib/python3.11/dist-packages/security/x.py", "added", None),
        ("/etc/environment", "changed", ("env", "/etc/environment")),
        ("/etc/default/locale", "added", ("env", "/etc/default/locale")),
        ("/etc/security/pam_env.conf", "changed", ("env", "/etc/security/pam_env.conf")),
        ("/root/.pam_environment", "added", ("env", "/root/.pam_environment")),
        ("/etc/environment", "removed", None),
        ("/app/.pam_environment", "added", ("env", "/app/.pam_environment")),  # a home there
        ("/usr/lib/environment.d/99-environment.conf", "added", None),  # systemd's link
        ("/etc/update-motd.d/00-x", "added", "dpkg"),  # pam_motd runs them at login
        ("/etc/update-motd.d/10-uname", "changed", "tamper"),
        ("/etc/security/namespace.init", "changed", "tamper"),
        ("/etc/login.defs", "changed", ("defs", "/etc/login.defs")),
        ("/etc/default/su", "added", ("defs", "/etc/default/su")),
        ("/etc/sudo.conf", "changed", "tamper"),  # names its plugins by path
        ("/etc/shadow-maint/useradd-pre.d/x", "added", "dpkg"),  # useradd runs them
        ("/usr/local/sbin/deluser.local", "added", "dpkg"),
        ("/etc/default/useradd", "changed", ("defs", "/etc/default/useradd")),
        ("/etc/default/grub", "changed", None),
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
        ("nss", "/etc/nsswitch.conf", "passwd x/../evil files\n", True),  # no colon
        ("nss", "/etc/nsswitch.conf", "passwd: files2\rx/../evil files\n", True),  # CR: a blank
        (
            "nss",
            "/etc/nsswitch.conf",
            "# note \\\npasswd: x/../evil files\n",
            True,
        ),  # no continuation
        ("pam", "/etc/pam.d/other", "auth required pam_deny.so\n@include common-auth\n", False),
        ("pam", "/etc/pam.d/login", "session optional pam_motd.so motd=/run/motd.dynamic\n", False),
        ("pam", "/etc/pam.d/other", "auth optional /tmp/p.so\n", True),
        ("pam", "/etc/pam.d/other", "-auth [success=1 default=ignore] /tmp/p.so\n", True),
        ("pam", "/etc/pam.d/other", "auth [default=ok]/app/evil.so\n", True),  # no space
        ("pam", "/etc/pam.d/other", "auth [a=b \\] c=d] /app/evil.so\n", True),  # escaped ]
        ("pam", "/etc/pam.d/other", "auth [success=1 default=ignore] pam_unix.so nullok\n", False),
        (
            "pam",
            "/etc/pam.d/other",
            "# x \\\nauth optional /app/evil.so\n",
            True,
        ),  # no continuation
        ("pam", "/etc/pam.d/other", "auth optional \\  \n /app/evil.so\n", True),  # continued
        ("pam", "/etc/pam.d/other", "session optional pam_exec.so /app/hook.sh\n", True),
        ("pam", "/etc/pam.d/other", "@include /tmp/evil\n", True),
        # A module of the image's module folder by its full path (old guides): that file is
        # judged where it is.
        (
            "pam",
            "/etc/pam.d/other",
            "auth required /lib/x86_64-linux-gnu/security/pam_unix.so\n",
            False,
        ),
        (
            "pam",
            "/etc/pam.d/other",
            "auth required /lib/x86_64-linux-gnu/security/../../../tmp/p.so\n",
            True,
        ),
        ("pam", "/etc/pam.d/other", "auth include /tmp/evil\n", True),
        ("pam", "/etc/pam.conf", "su auth optional /tmp/p.so\n", True),
        ("pam", "/etc/pam.conf", "su auth required pam_unix.so\n", False),
        # Read otherwise by PAM than by a simple reading: refused.
        (
            "pam",
            "/etc/pam.d/su",
            "session optional \\\n\n# note\npam_exec.so /tmp/hook.sh\n",
            True,
        ),  # PAM joins across blank and comment lines
        ("pam", "/etc/pam.d/su", "session required pam_env.so envfile=/etc/environment[d]\n", True),
        (
            "pam",
            "/etc/pam.d/su",
            "session required pam_env.so envfile=/etc/environment\x0bd\n",
            True,
        ),
        (
            "pam",
            "/etc/pam.d/su",
            "session optional pam_permit.so" + " " * 1000 + "session optional pam_exec.so /x\n",
            True,
        ),  # PAM reads 1023 bytes at a time: the rest is a line of its own
        ("pam", "/etc/pam.d/su", "session required pam_env.so readenv=1 user_readenv=1\n", False),
        (
            "pam",
            "/etc/pam.d/su",
            "session optional /lib/x86_64-linux-gnu/security/pam_exec.so /tmp/hook.sh\n",
            True,
        ),  # the image's pam_exec by its full path still runs a program
        ("pam", "/etc/pam.d/su", "@INCLUDE /tmp/evil\n", True),  # PAM ignores the case
        ("pam", "/etc/pam.d/su", "session optional [pam_exec.so] /tmp/hook.sh\n", True),
        ("pam", "/etc/pam.d/su", "session required [pam_env.so] envfile=/tmp/e\n", True),
        (
            "pam",
            "/etc/pam.d/su",
            "session optional pam_permit.so "
            + "\u00e9" * 496
            + "session optional pam_exec.so /x\n",
            True,
        ),  # 1023 bytes in 527 characters: PAM counts bytes
        ("env", "/etc/environment", "TZ=x" + "a" * 1019 + "LD_PRELOAD=/app/x.so\n", True),
        # su and runuser take the PATH of what they run from these settings.
        ("defs", "/etc/default/su", "ALWAYS_SET_PATH yes\nENV_PATH PATH=/tmp/bin:/bin\n", True),
        ("defs", "/etc/login.defs", "ENV_SUPATH\tPATH=/usr/sbin:/usr/bin:/sbin:/bin\n", False),
        ("defs", "/etc/login.defs", "PASS_MAX_DAYS 90\nUMASK 027 # stricter\n", False),
        ("defs", "/etc/login.defs", "USERDEL_CMD /app/cleanup.sh\n", True),
        ("defs", "/etc/login.defs", "# ENV_PATH PATH=/app\n", False),
        ("defs", "/etc/default/su", "ENV_PATH=PATH=/tmp/bin:/bin\n", True),  # `=` ends a name
        ("defs", "/etc/default/su", 'env_supath "PATH=/tmp/bin"\n', True),
        ("defs", "/etc/default/su", "UMASK 022" + " " * 8190 + "ENV_PATH /tmp\n", True),
        ("defs", "/etc/default/useradd", "SHELL=/bin/bash\nHOME=/home\n", False),
        ("defs", "/etc/default/useradd", "SHELL=/tmp/evsh\n", True),  # what su user -c runs
        # pam_env reads only the environment files judged by their content.
        (
            "pam",
            "/etc/pam.d/su",
            "session required pam_env.so readenv=1 envfile=/etc/default/locale\n",
            False,
        ),
        ("pam", "/etc/pam.d/su", "session required pam_env.so envfile=/app/env\n", True),
        ("pam", "/etc/pam.d/su", "session required pam_env.so [conffile=/tmp/c]\n", True),
        ("pam", "/etc/pam.d/su", "session required pam_env.so user_envfile=.x\n", True),
        (
            "pam",
            "/etc/pam.d/su",
            "session required /lib/x86_64-linux-gnu/security/pam_env.so envfile=/app/e\n",
            True,
        ),  # the image's module by its full path, reading the agent's file
        # An environment file sets a locale, a time zone and the system's PATH, nothing else.
        ("env", "/etc/default/locale", "LANG=C.UTF-8\nexport LC_ALL=C.UTF-8\n", False),
        ("env", "/etc/environment", 'TZ="Europe/Paris"\n# LD_PRELOAD=/x\n', False),
        (
            "env",
            "/etc/environment",
            'PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin"\n',
            False,
        ),  # Ubuntu's
        ("env", "/etc/environment", "LD_PRELOAD=/tmp/p.so\n", True),
        ("env", "/etc/environment", "export PYTHONPATH=/app\n", True),
        ("env", "/etc/environment", "PATH=/app/bin:/usr/bin\n", True),
        ("env", "/etc/environment", "LANG=../../app/x\n", True),
        ("env", "/etc/environment", "LANG=C \\\nLD_PRELOAD=/tmp/p.so\n", True),  # continued
        ("env", "/etc/environment", "# x \\\nLD_PRELOAD=/tmp/p.so\n", True),  # either way
        ("env", "/etc/environment", "LANG=C\rLD_PRELOAD=/tmp/p.so\n", True),
        ("env", "/etc/environment", "LANG\tLD_PRELOAD=x.so\n", True),  # the name is all before =
        ("env", "/etc/environment", "LANGUAGE=en_US:en\nLC_TIME=C.UTF-8\n", False),
        ("env", "/etc/environment", "PATH=/usr/bin:\n", True),  # an empty entry: the cwd
        ("env", "/etc/security/pam_env.conf", "LANG DEFAULT=C.UTF-8\n", False),
        ("env", "/etc/security/pam_env.conf", "LD_PRELOAD DEFAULT=/tmp/p.so\n", True),
        ("env", "/etc/security/pam_env.conf", "PATH DEFAULT=/app:/usr/bin\n", True),
        ("env", "/root/.pam_environment", "BASH_ENV=/app/x\n", True),
        # Expanded, a locale's value is whatever another variable holds.
        ("env", "/etc/security/pam_env.conf", "LC_ALL DEFAULT=${TZ}\n", True),
        ("env", "/etc/security/pam_env.conf", "LANGUAGE DEFAULT=@{HOME}\n", True),
        ("env", "/etc/default/locale", "LANG=de_DE@euro\n", False),
        ("env", "/etc/environment", "LANGUAGE=\\\n#\nTZ=/x\n", True),  # continued
        ("env", "/etc/environment", "\\\nLD_PRELOAD=x.so\n", True),  # a lone backslash too
        # A comment never continues (the image's pam_env.conf has one ending in `\`).
        ("env", "/etc/security/pam_env.conf", "#PATH DEFAULT=${HOME}/bin:/bin\\\n", False),
        ("pam", "/etc/pam.d/su", "# a \\\nauth required pam_unix.so # b \\\n", False),
        ("env", "/etc/environment", "PATH=/usr/bin:/bin\r\nLANG=C\r\n", False),  # CRLF
        ("env", "/etc/environment", "LANG=C\x0bLD_PRELOAD=x.so\n", True),
    ],
)
def test_problems(kind: str, path: str, text: str, bad: bool) -> None:
    found = problems(kind, path, text)
    assert bool(found) == bad, found
    assert all(path in reason for reason in found)


def test_a_configuration_made_a_link_is_tamper() -> None:
    """A link to /proc/self/cwd/x names another file for each reader: the check's and the
    tests' would read different ones."""
    for path in ("/etc/nsswitch.conf", "/etc/pam.d/su", "/etc/environment"):
        verdict = classify(path, "changed", link=True)
        assert isinstance(verdict, str) and path in verdict, verdict


def test_a_configuration_too_large_to_read_whole_is_tamper() -> None:
    text = "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1)
    assert problems("nss", "/etc/nsswitch.conf", text)
