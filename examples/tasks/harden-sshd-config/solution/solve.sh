#!/bin/bash
# Reference solution: drop every active occurrence of the managed keywords from
# the global section, then insert the wanted values before the first Match.
set -euo pipefail
cd /app/etc/ssh
cp -p sshd_config sshd_config.orig
awk '
  BEGIN {
    split("port permitrootlogin passwordauthentication permitemptypasswords maxauthtries x11forwarding allowusers", k, " ")
    for (i in k) managed[k[i]] = 1
  }
  function settings() {
    print "# Hardened settings"
    print "Port 2222"
    print "PermitRootLogin no"
    print "PasswordAuthentication no"
    print "PermitEmptyPasswords no"
    print "MaxAuthTries 3"
    print "X11Forwarding no"
    print "AllowUsers deploy admin"
    print ""
    done = 1
  }
  !done && tolower($1) == "match" { settings() }
  {
    if (!done) {
      kw = tolower($1); sub(/=.*/, "", kw)
      if (kw in managed) next
    }
    print
  }
  END { if (!done) settings() }
' sshd_config.orig > sshd_config
