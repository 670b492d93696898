import os, socket, torch
def t(name, f):
    try: print(name, "OK", f())
    except Exception as e: print(name, "REFUSED", type(e).__name__, e)
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"from-arm-udp", ("127.0.0.1", 47931)); return "sent"
def unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(3); s.connect("/tmp/h4-canary/probe.sock"); s.send(b"from-arm-unix"); return "sent"
def shm_w():
    open("/dev/shm/h4-canary-from-arm", "w").write("x"); return os.listdir("/dev/shm")[:5]
def shm_r():
    return open("/dev/shm/h4-planted-secret").read()
def cg():
    open("/sys/fs/cgroup/memory/cgroup.procs","w").write(str(os.getpid())); return open("/proc/self/cgroup").read()
t("udp", udp); t("unix", unix); t("shm_w", shm_w); t("shm_r", shm_r); t("cgroup-escape", cg)
print(torch.ones(2).sum())
