"""The payload audit: what a wheel we ship may hold, checked before release.

An operator's pip unpacks a wheel into site-packages and Python imports from
there, so a stray file is code of ours on their host. The audit guarantees that
a wheel holds only what the engine build makes (the allowlist,
packaging/payload-policy.toml): nothing that installs outside site-packages,
nothing Python imports at start-up or that shadows the standard library, no
Python source, no library that is not ours or that needs one the target lacks;
and that it installs and imports beside the target's torch. It fails closed:
a damaged or hostile wheel gives findings (the wheel, the entry, the rule),
never a traceback.

Where each rule lives:
    policy.py      the policy (an unreadable one is a ConfigError)
    wheel.py       what the rules compare against: the names the build gives
                   this wheel's parts; Finding
    static.py      format (an unreadable zip), size; runs the static rules
    entries.py     duplicate, path, special-file, shadows, no-python,
                   foreign-library, not-ours, missing, format (an entry)
    metadata.py    tags, version, metadata, torch-pin, entry-point, sbom, record
    elf.py         elf, needed, rpath, foreign-library (a graft none needs)
    load_check.py  loads
"""
