"""What NVML's "used" memory holds when no process is listed (the driver's
reservation) versus a CUDA process's own usedGpuMemory: the baseline the
unaccounted-memory check subtracts (helpers/facts/gpumemory.py).

Run on a GPU host: python3 bench/nvml_memory_probe.py /path/to/torch/python
(ctypes only; LD_LIBRARY_PATH must find libnvidia-ml.so.1).  Result on H200:
docs/performance.md, "Facts the code is built on"."""
import ctypes as C,subprocess as S,sys,time
n=C.CDLL("libnvidia-ml.so.1");n.nvmlInit_v2();M=1<<20
class V2(C.Structure):_fields_=[("v",C.c_uint),("t",C.c_ulonglong),("r",C.c_ulonglong),("f",C.c_ulonglong),("u",C.c_ulonglong)]
class V1(C.Structure):_fields_=[("t",C.c_ulonglong),("f",C.c_ulonglong),("u",C.c_ulonglong)]
class P(C.Structure):_fields_=[("pid",C.c_uint),("m",C.c_ulonglong),("g",C.c_uint),("c",C.c_uint)]
def snap(l):
 h=C.c_void_p();n.nvmlDeviceGetHandleByIndex_v2(0,C.byref(h));a=V1();n.nvmlDeviceGetMemoryInfo(h,C.byref(a));b=V2();b.v=C.sizeof(V2)|(2<<24);rc=n.nvmlDeviceGetMemoryInfo_v2(h,C.byref(b))
 k=C.c_uint(64);p=(P*64)();n.nvmlDeviceGetComputeRunningProcesses_v3(h,C.byref(k),p)
 print(l,"v1used",a.u//M,"v2rc",rc,"v2used",b.u//M,"reserved",b.r//M,"procs",[(p[i].pid,p[i].m//M) for i in range(k.value)],flush=True)
snap("idle")
x=S.Popen([sys.argv[1],"-c","import torch,time;x=torch.empty(2<<30,dtype=torch.uint8,device='cuda:0');torch.cuda.synchronize();print('r',flush=True);time.sleep(30)"],stdout=S.PIPE,text=True)
x.stdout.readline();time.sleep(.3);snap("hold")
x.kill();x.wait();t=time.monotonic()
snap("killed")
time.sleep(.5);snap("after")
