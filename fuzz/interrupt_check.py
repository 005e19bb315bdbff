#!/usr/bin/env python3
"""Seeded interruption check of the depthkv program's output files (standard library only).

Every output file of the program is written atomically (include/depthkv/detail/atomic_file.hpp:
a temporary file `.<name>.depthkv-tmp.<pid>.<n>` in the same folder, fsync, rename), and SIGINT,
SIGTERM and SIGHUP remove the temporary file of a write in progress before the program ends
(tools/depthkv.cpp). This script checks that from the outside, on stories260K with small settings
(one thread, so that every run gives the same bytes):

  profile  `depthkv profile --head-curves` (two scorers: layer and head checkpoints), interrupted
           1 to 3 times in a row by SIGINT or SIGTERM at a random moment in [0, T] (T: the
           uninterrupted run's duration); each later attempt continues with --resume. Half the
           cases start with a previous complete profile of other settings at the output path
           (the first attempt then overwrites it without --resume).
  eval     `depthkv eval --csv` (writes out.csv, then out-sensitivity.csv), interrupted once;
           half the cases start with previous complete CSV files of other settings there.

After every interrupted attempt:
  R1 exit       the program was killed by the signal sent, or had exited 0 before it came
                (any other exit, or exit 0 with output unlike the uninterrupted run's, fails)
  R2 temp       no temporary file (".depthkv-tmp.") and no other unexpected file in the folder
  R3 whole      each output path holds nothing (only if nothing was there before), the previous
                file byte for byte, or a complete file of this run: for eval the uninterrupted
                run's bytes; for profile the uninterrupted run's bytes or a checkpoint, i.e. strict
                JSON (no NaN/Infinity) with format "depthkv-profile", the version, and this run's
                model, layers, keep ratios and calibration (the --resume rerun then loads it with
                the program's full schema check)
Then one rerun without a signal (profile: with --resume unless the path holds the previous
file of other settings, which --resume refuses; eval: the same command again):
  R4 rerun      exit 0, no temporary file, and every output byte for byte the uninterrupted run's

A file left by SIGKILL (or power loss) mid-write is out of scope: that is the one way a
`.<name>.depthkv-tmp.<pid>.<n>` file stays behind, and it may be deleted; the destination itself
is never partial.

Disk full, once per run (each must exit 1 with "depthkv: error: ... disk full or not writable",
leave a previous file untouched and no temporary file):
  D1 profile -o /dev/full, D2 eval --csv /dev/full (both: /dev/full stays a device);
  D3 profile and D4 eval --csv with the file-size limit (RLIMIT_FSIZE) below the output's size,
  over a previous file (EFBIG, as ENOSPC: the write fails part way);
  D5 profile and eval --csv over previous files in a small tmpfs (mount -t tmpfs -o size=256k)
  filled to the last block (ENOSPC): only where mount works (root with CAP_SYS_ADMIN); otherwise
  reported as skipped.

Cases are a pure function of (seed, kind, index). The work folder (a new depthkv-interrupt-*
folder in --out, default the system temp folder; outside the repository) is removed at the end
unless a check failed or --keep is given.
Exit 0 when every check passed, 1 otherwise; missing data: 1, or with DEPTHKV_SKIP_MISSING_DATA=1
"SKIP: ..." and exit 77 (CTest: skipped). The data folder is $DEPTHKV_DATA_DIR when set, else
--data (default ../shared beside the repository).

The full check (100 cases each, about 4 minutes at 2 cores; results in fuzz/results/):
  python3 fuzz/interrupt_check.py --seed 1 --count 100 --json fuzz/results/interrupt_check.json
CI (tests/CMakeLists.txt, `interrupt_check_small`): --count 5.

usage: interrupt_check.py [--bin PATH] [--data DIR] [--out DIR] [--seed N] [--count N]
                          [--kind profile,eval] [--timeout S] [--json FILE] [--keep]
"""
import argparse
import json
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMP_MARK = ".depthkv-tmp."
KINDS = ["profile", "eval"]
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}

# Small settings: about 1 s for profile and 0.5 s for eval at one thread (release build).
PROFILE_ARGS = ["--context", "96", "--continuation", "32", "--windows", "2", "--scorers", "h2o,snapkv",
                "--head-curves", "--threads", "1"]
PREV_PROFILE_ARGS = ["--context", "64", "--continuation", "16", "--windows", "1", "--scorers", "h2o",
                     "--threads", "1"]  # the "previous" file: another calibration (--resume refuses it)
EVAL_ARGS = ["--windows", "16", "--keeps", "0.3,0.5,0.75", "--policies", "uniform,optimal,head-optimal",
             "--threads", "1"]
PREV_EVAL_ARGS = ["--windows", "2", "--keeps", "0.5", "--policies", "uniform", "--threads", "1"]  # on the previous profile


def fail_setup(msg):
    sys.exit("interrupt_check: " + msg)


def child_setup(fsize=None):
    """Run in the child before exec: default SIGINT/SIGTERM/SIGHUP (a parent that ignores them,
    e.g. a shell's background job, would pass that on), and an optional file-size limit."""
    def f():
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return f


def run(argv, cwd, timeout, fsize=None):
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    r = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                       env=env, timeout=timeout, preexec_fn=child_setup(fsize))
    return r.returncode, r.stderr.decode(errors="replace")


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def strict_json(data):
    def refuse(c):
        raise ValueError("non-finite number " + c)
    return json.loads(data.decode("utf-8"), parse_constant=refuse)


def temp_files(folder):
    return sorted(n for n in os.listdir(folder) if TEMP_MARK in n)


def data_files(data):
    """(model, text) in the data folder; a missing file ends the check (exit 1, or 77 after "SKIP: ..."
    with DEPTHKV_SKIP_MISSING_DATA=1)."""
    model = os.path.join(data, "models", "stories260K", "stories260K.bin")
    text = os.path.join(data, "text", "tinystories_valid.txt")
    for p in (model, os.path.join(data, "models", "stories260K", "tok512.bin"), text):
        if not os.path.isfile(p):
            if os.environ.get("DEPTHKV_SKIP_MISSING_DATA") == "1":
                print("SKIP: real data file missing: %s" % p)
                sys.exit(77)
            fail_setup("real data file missing: %s (put the shared/ folder beside the project or set "
                       "DEPTHKV_DATA_DIR; DEPTHKV_SKIP_MISSING_DATA=1 skips)" % p)
    return model, text


class Setup:
    """Inputs and the uninterrupted runs' outputs (the references), made once."""

    def __init__(self, exe, data, work, timeout):
        self.exe, self.work, self.timeout = exe, work, timeout
        self.model, text = data_files(data)
        self.dir = os.path.join(work, "base")
        os.makedirs(self.dir, exist_ok=True)
        full = open(text, "rb").read()
        cut = full.find(b"\n\n", 100000)  # whole stories, enough for the calibration and eval windows
        self.text = os.path.join(self.dir, "text.txt")
        open(self.text, "wb").write(full[: cut + 1])
        self.ref_profile, self.profile_s = self.timed(["profile"] + self.model_args() + PROFILE_ARGS, "ref.profile.json")
        self.prev_profile, _ = self.timed(["profile"] + self.model_args() + PREV_PROFILE_ARGS, "prev.profile.json")
        self.profile_path = os.path.join(self.dir, "ref.profile.json")
        self.ref_json = strict_json(self.ref_profile)
        ref_eval_args = ["eval"] + self.model_args() + ["--profile", self.profile_path] + EVAL_ARGS
        t0 = time.time()
        self.check_rc(run([exe] + ref_eval_args + ["--csv", "ref.csv"], self.dir, timeout), "eval")
        self.eval_s = time.time() - t0
        self.ref_csv = (read(os.path.join(self.dir, "ref.csv")), read(os.path.join(self.dir, "ref-sensitivity.csv")))
        self.check_rc(run([exe, "eval"] + self.model_args() + ["--profile", "prev.profile.json"] + PREV_EVAL_ARGS +
                          ["--csv", "prev.csv"], self.dir, timeout), "eval")
        self.prev_csv = (read(os.path.join(self.dir, "prev.csv")), read(os.path.join(self.dir, "prev-sensitivity.csv")))
        if any(p == r for p, r in zip(self.prev_csv + (self.prev_profile,), self.ref_csv + (self.ref_profile,))):
            fail_setup("the previous files equal the references (the check could not tell them apart)")

    def model_args(self):
        return ["--model", self.model, "--text", self.text]

    def check_rc(self, r, what):
        if r[0] != 0:
            fail_setup("setup %s failed (exit %s): %s" % (what, r[0], r[1][-2000:]))

    def timed(self, args, name):
        t0 = time.time()
        self.check_rc(run([self.exe] + args + ["-o", name], self.dir, self.timeout), args[0])
        return read(os.path.join(self.dir, name)), time.time() - t0


class Case:
    def __init__(self, kind, index):
        self.kind, self.index = kind, index
        self.failures = []
        self.attempts = []  # (signal name, delay s, outcome, state of the outputs)
        self.rerun = None   # "resume" / "restart"

    def fail(self, rule, why):
        self.failures.append("%s %s-%d: %s" % (rule, self.kind, self.index, why))


def interrupted_run(argv, cwd, sig, delay, timeout):
    """Starts `argv`, sends `sig` after `delay` seconds unless it has exited; (outcome, exit code,
    stderr): outcome "interrupted" (killed by `sig`), "finished" (exit 0 before the signal) or "other"."""
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         env=env, preexec_fn=child_setup())
    sent = False
    try:
        p.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        p.send_signal(sig)
        sent = True
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        return "other", "hang", err.decode(errors="replace")
    rc = p.returncode
    if sent and rc == -sig:
        return "interrupted", rc, ""
    if rc == 0:
        return "finished", rc, ""
    return "other", rc, err.decode(errors="replace")


def check_folder(case, d, allowed):
    left = temp_files(d)
    if left:
        case.fail("R2", "temporary files left: %s" % ", ".join(left))
    extra = sorted(set(os.listdir(d)) - set(allowed) - set(left))
    if extra:
        case.fail("R2", "unexpected files: %s" % ", ".join(extra))


def profile_state(s, data, prev, existed):
    """'absent', 'previous', 'complete', 'checkpoint', or None when the file is not whole."""
    if data is None:
        return "absent" if prev is None and not existed else None
    if prev is not None and data == prev:
        return "previous"
    if data == s.ref_profile:
        return "complete"
    try:
        j = strict_json(data)
    except (ValueError, UnicodeDecodeError):
        return None
    r = s.ref_json
    ok = (isinstance(j, dict) and j.get("format") == "depthkv-profile" and j.get("version") == r["version"] and
          all(j.get(k) == r[k] for k in ("model", "n_layers", "keep_ratios", "calibration")) and
          isinstance(j.get("scorers"), dict))
    return "checkpoint" if ok else None


def new_case(s, seed, kind, index):
    """(rng, case, folder) of case `index` of `kind`: its seeded generator and an empty folder."""
    d = os.path.join(s.work, "%s-%d" % (kind, index))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return random.Random("%d:%s:%d" % (seed, kind, index)), Case(kind, index), d


def profile_case(s, seed, index, timeout):
    rng, case, d = new_case(s, seed, "profile", index)
    out = os.path.join(d, "p.json")
    prev = s.prev_profile if rng.random() < 0.5 else None
    if prev is not None:
        open(out, "wb").write(prev)
    base = [s.exe, "profile"] + s.model_args() + PROFILE_ARGS + ["-o", "p.json"]
    existed = prev is not None
    for _ in range(rng.choice([1, 1, 2, 3])):
        sig_name = rng.choice(sorted(SIGNALS))
        delay = rng.uniform(0.0, s.profile_s)
        holds_prev = prev is not None and read(out) == prev
        argv = base if holds_prev else base + ["--resume"]
        outcome, rc, err = interrupted_run(argv, d, SIGNALS[sig_name], delay, timeout)
        data = read(out)
        state = profile_state(s, data, prev, existed)
        existed = existed or data is not None
        case.attempts.append((sig_name, round(delay, 3), outcome, state))
        if outcome == "other":
            case.fail("R1", "exit %s after %s at %.3f s: %s" % (rc, sig_name, delay, err.strip()[-300:]))
        if outcome == "finished" and data != s.ref_profile:
            case.fail("R1", "exit 0 but the profile differs from the uninterrupted run's")
        check_folder(case, d, ["p.json"])
        if state is None:
            case.fail("R3", "after %s at %.3f s the profile is neither absent, the previous file, nor a whole "
                      "profile of this run (%s bytes)" % (sig_name, delay, len(data) if data is not None else "no"))
        if case.failures:
            return case
    holds_prev = prev is not None and read(out) == prev
    case.rerun = "restart" if holds_prev or read(out) is None else "resume"
    rc, err = run(base if holds_prev else base + ["--resume"], d, timeout)
    if rc != 0:
        case.fail("R4", "the rerun (%s) exited %s: %s" % (case.rerun, rc, err.strip()[-300:]))
    elif read(out) != s.ref_profile:
        case.fail("R4", "the rerun (%s) gave another profile than the uninterrupted run" % case.rerun)
    check_folder(case, d, ["p.json"])
    return case


def eval_case(s, seed, index, timeout):
    rng, case, d = new_case(s, seed, "eval", index)
    names = ["out.csv", "out-sensitivity.csv"]
    prev = s.prev_csv if rng.random() < 0.5 else (None, None)
    for name, data in zip(names, prev):
        if data is not None:
            open(os.path.join(d, name), "wb").write(data)
    argv = [s.exe, "eval"] + s.model_args() + ["--profile", s.profile_path] + EVAL_ARGS + ["--csv", "out.csv"]
    sig_name = rng.choice(sorted(SIGNALS))
    delay = rng.uniform(0.0, s.eval_s)
    outcome, rc, err = interrupted_run(argv, d, SIGNALS[sig_name], delay, timeout)
    states = []
    for name, before, ref in zip(names, prev, s.ref_csv):
        data = read(os.path.join(d, name))
        if data is None and before is None:
            states.append("absent")
        elif data is not None and data == before:
            states.append("previous")
        elif data == ref:
            states.append("complete")
        else:
            states.append(None)
            case.fail("R3", "after %s at %.3f s %s is neither absent, the previous file, nor the whole new file "
                      "(%s bytes)" % (sig_name, delay, name, len(data) if data is not None else "no"))
    case.attempts.append((sig_name, round(delay, 3), outcome, "+".join(str(x) for x in states)))
    if outcome == "other":
        case.fail("R1", "exit %s after %s at %.3f s: %s" % (rc, sig_name, delay, err.strip()[-300:]))
    if outcome == "finished" and states != ["complete", "complete"]:
        case.fail("R1", "exit 0 but the CSV files differ from the uninterrupted run's")
    check_folder(case, d, names)
    if case.failures:
        return case
    case.rerun = "restart"
    rc, err = run(argv, d, timeout)
    if rc != 0:
        case.fail("R4", "the rerun exited %s: %s" % (rc, err.strip()[-300:]))
    elif (read(os.path.join(d, names[0])), read(os.path.join(d, names[1]))) != s.ref_csv:
        case.fail("R4", "the rerun gave other CSV files than the uninterrupted run")
    check_folder(case, d, names)
    return case


def expect_disk_full(results, name, r, message, files):
    """`r` = (exit code, stderr) must be exit 1 with `message`; `files` = [(path, bytes before)] must be unchanged;
    no temporary file beside any of them."""
    rc, err = r
    why = []
    if rc != 1:
        why.append("exit %s, expected 1" % rc)
    if "depthkv: error: " not in err or message not in err:
        why.append("the message lacks %r: %s" % (message, err.strip()[-300:]))
    for path, before in files:
        if read(path) != before:
            why.append("%s changed" % path)
        if temp_files(os.path.dirname(path)):
            why.append("temporary files left beside %s" % path)
    results[name] = "fail: " + "; ".join(why) if why else "pass"


def disk_full_cases(s, timeout):
    res = {}
    prof = [s.exe, "profile"] + s.model_args() + PROFILE_ARGS
    ev = [s.exe, "eval"] + s.model_args() + ["--profile", s.profile_path] + EVAL_ARGS
    d = os.path.join(s.work, "disk-full")
    os.makedirs(d, exist_ok=True)
    for name, argv, msg in (("D1 profile -o /dev/full", prof + ["-o", "/dev/full"],
                             "cannot write profile file '/dev/full': disk full or not writable"),
                            ("D2 eval --csv /dev/full", ev + ["--csv", "/dev/full"],
                             "cannot write '/dev/full' (CSV): disk full or not writable")):
        expect_disk_full(res, name, run(argv, d, timeout), msg, [])
        if not stat.S_ISCHR(os.stat("/dev/full").st_mode):
            res[name] = "fail: /dev/full is no longer a device"
    # D3, D4: the file-size limit, over previous files
    p, c = os.path.join(d, "p.json"), os.path.join(d, "out.csv")
    open(p, "wb").write(s.prev_profile)
    expect_disk_full(res, "D3 profile over a file, file-size limit", run(prof + ["-o", p], d, timeout, fsize=4096),
                     "cannot write profile file '%s': disk full or not writable" % p, [(p, s.prev_profile)])
    open(c, "wb").write(s.prev_csv[0])
    expect_disk_full(res, "D4 eval --csv over a file, file-size limit", run(ev + ["--csv", c], d, timeout, fsize=256),
                     "cannot write '%s' (CSV): disk full or not writable" % c, [(c, s.prev_csv[0])])
    # D5: a small tmpfs, where mount works
    m = os.path.join(d, "tmpfs")
    os.makedirs(m, exist_ok=True)
    name = "D5 profile and eval --csv into a full 256 KiB tmpfs"
    mr = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", m], capture_output=True)
    if mr.returncode != 0:
        res[name] = "skipped: mount refused (%s)" % mr.stderr.decode(errors="replace").strip()[:200]
        return res
    try:
        p, c = os.path.join(m, "p.json"), os.path.join(m, "out.csv")
        open(p, "wb").write(s.prev_profile)
        open(c, "wb").write(s.prev_csv[0])
        st = os.statvfs(m)
        open(os.path.join(m, "filler"), "wb").write(b"\0" * (st.f_bavail * st.f_frsize))  # no room left
        r1 = run(prof + ["-o", p], d, timeout)
        r2 = run(ev + ["--csv", c], d, timeout)
        sub = {}
        expect_disk_full(sub, "p", r1, "cannot write profile file '%s': disk full or not writable" % p,
                         [(p, s.prev_profile)])
        expect_disk_full(sub, "c", r2, "cannot write '%s' (CSV): disk full or not writable" % c, [(c, s.prev_csv[0])])
        bad = [v for v in sub.values() if v != "pass"]
        res[name] = "; ".join(bad) if bad else "pass"
    finally:
        subprocess.run(["umount", m], capture_output=True)
    return res


def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty", "--abbrev=7"],
                              capture_output=True, text=True, timeout=30).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("DEPTHKV_BIN", os.path.join(REPO, "build", "release", "tools",
                                                                                 "depthkv")))
    ap.add_argument("--data", default=os.path.join(os.path.dirname(REPO), "shared"),
                    help="data folder ($DEPTHKV_DATA_DIR wins when set)")
    ap.add_argument("--out", default=None, help="where the work folder is made (default: the system temp folder)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100, help="cases per kind")
    ap.add_argument("--kind", default=",".join(KINDS))
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run before it counts as a hang")
    ap.add_argument("--json", default=None, help="write the summary to this JSON file")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    exe = os.path.abspath(a.bin)
    if not os.access(exe, os.X_OK):
        fail_setup("no program at %s (--bin)" % exe)
    data = os.path.abspath(os.environ.get("DEPTHKV_DATA_DIR") or a.data)
    if a.out and os.path.commonpath([os.path.abspath(a.out), REPO]) == REPO:
        fail_setup("--out must lie outside the repository")
    kinds = [k for k in a.kind.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            fail_setup("unknown kind %s (%s)" % (k, ", ".join(KINDS)))
    data_files(data)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    work = os.path.abspath(tempfile.mkdtemp(prefix="depthkv-interrupt-", dir=a.out))
    t_start = time.time()
    s = Setup(exe, data, work, a.timeout)
    summary = {"commit": git_commit(), "program": os.path.relpath(exe, REPO) if exe.startswith(REPO) else exe,
               "seed": a.seed, "count_per_kind": a.count,
               "uninterrupted_s": {"profile": round(s.profile_s, 3), "eval": round(s.eval_s, 3)}, "kinds": {}}
    failures = []
    for kind in kinds:
        tally = {"cases": 0, "signals": {"SIGINT": 0, "SIGTERM": 0}, "interrupted": 0, "finished_before_signal": 0,
                 "other_exit": 0, "states_after_signal": {}, "reruns": {}, "failed_cases": 0}
        for i in range(a.count):
            case = (profile_case if kind == "profile" else eval_case)(s, a.seed, i, a.timeout)
            tally["cases"] += 1
            for sig_name, _, outcome, state in case.attempts:
                tally["signals"][sig_name] += 1
                key = {"interrupted": "interrupted", "finished": "finished_before_signal"}.get(outcome, "other_exit")
                tally[key] += 1
                if outcome == "interrupted":
                    tally["states_after_signal"][str(state)] = tally["states_after_signal"].get(str(state), 0) + 1
            if case.rerun:
                tally["reruns"][case.rerun] = tally["reruns"].get(case.rerun, 0) + 1
            if case.failures:
                tally["failed_cases"] += 1
                failures += case.failures
            else:
                shutil.rmtree(os.path.join(work, "%s-%d" % (kind, i)), ignore_errors=True)
            if (i + 1) % 20 == 0:
                print("interrupt_check: %s %d/%d, %.0f s" % (kind, i + 1, a.count, time.time() - t_start),
                      file=sys.stderr, flush=True)
        summary["kinds"][kind] = tally
    summary["disk_full"] = disk_full_cases(s, a.timeout)
    failures += ["%s: %s" % (k, v) for k, v in summary["disk_full"].items() if v.startswith("fail")]
    summary["failures"] = failures
    summary["seconds"] = round(time.time() - t_start, 1)

    print("interrupt_check: %s, commit %s, seed %d, %d cases per kind, %.0f s (uninterrupted: profile %.2f s, "
          "eval %.2f s)" % (summary["program"], summary["commit"], a.seed, a.count, summary["seconds"], s.profile_s,
                            s.eval_s))
    print("| kind | cases | signals (INT/TERM) | interrupted | exited before the signal | output after the signal "
          "| reruns | failed cases |")
    print("|---|---:|---:|---:|---:|---|---|---:|")
    for kind, t in summary["kinds"].items():
        print("| %s | %d | %d (%d/%d) | %d | %d | %s | %s | %d |" % (
            kind, t["cases"], sum(t["signals"].values()), t["signals"]["SIGINT"], t["signals"]["SIGTERM"],
            t["interrupted"], t["finished_before_signal"],
            ", ".join("%s %d" % kv for kv in sorted(t["states_after_signal"].items())),
            ", ".join("%s %d" % kv for kv in sorted(t["reruns"].items())), t["failed_cases"]))
    for k, v in summary["disk_full"].items():
        print("%s: %s" % (k, v))
    for f in failures:
        print("FAIL " + f)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    if failures or a.keep:
        print("interrupt_check: work folder kept: %s" % work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("interrupt_check: %s" % ("%d failures" % len(failures) if failures else "all checks passed"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
