# Host emulation of src/cuda/select.cu's quest_topk_kernel, line by line: a cluster of C = 1, 2,
# 4 or 8 CTAs per (sequence, kv head), each 1024 threads as 32 warps x 32 lanes over its slice of the
# candidates (per-slice radix histograms summed over the cluster, the bin search, the ballot
# compaction with the lower slices' counts as bases), against the CPU's topk_one rule (ties to
# the lower id). Not a substitute for running the kernel; it checks the algorithm and
# select_capacity. Run: python3 tools/gpu_bench/host_emu/topk_emu.py
import random
T=1024; W=32; C=8  # C: CTAs per cluster (1, 2, 4, 8 by the pairs; set per trial)
def popc(x): return bin(x).count('1')
def kernel(keys, n, page, last, budget, sinks_p, window_tokens, max_per_head):
    global C
    out=[None]*max_per_head; count=None
    length=(n-1)*page+last
    sinks=min(sinks_p,n)
    first=max(0,length-window_tokens)
    window = first//page if window_tokens>0 else n-1
    window=min(window,n-1)
    kept = n if sinks>=window else sinks+(n-window)
    total=min(n,max(budget,kept))
    assert total<=max_per_head
    need=total-kept; s0=min(sinks,window); nsel=max(need,0)
    for j in range(s0): out[j]=j
    for j in range(window,n): out[s0+nsel+(j-window)]=j
    for i in range(total,max_per_head): out[i]=-1
    count=total
    if nsel==0: return out,count
    lo,hi=sinks,window; cand=hi-lo
    take_all = nsel>=cand
    sl=(cand+C*32-1)//(C*32)*32
    slices=[]
    for r in range(C):
        slo=min(hi,lo+r*sl); shi=min(hi,slo+sl); slices.append((slo,shi))
    prefix=0;pmask=0;k_rem=nsel
    global RADIX
    if not take_all:
        RADIX+=1
        for shift in (24,16,8,0):
            hist=[0]*256
            for (slo,shi) in slices:  # each CTA's histogram, summed by warp 0 of every CTA
                iters=(shi-slo+T-1)//T
                h=[0]*256
                for it in range(iters):
                    for tid in range(T):
                        j=slo+it*T+tid
                        if j<shi and (keys[j]&pmask)==prefix:
                            h[(keys[j]>>shift)&255]+=1
                for i in range(256): hist[i]+=h[i]
            c=[[hist[8*l+i] for i in range(8)] for l in range(32)]
            sums=[sum(x) for x in c]
            suffix=[sum(sums[l:]) for l in range(32)]
            found=0
            for l in range(32):
                above=suffix[l]-sums[l]
                if suffix[l]>=k_rem and above<k_rem:
                    found+=1
                    acc=above
                    for i in range(7,-1,-1):
                        if acc+c[l][i]>=k_rem:
                            s_bin=8*l+i; s_krem=k_rem-acc; break
                        acc+=c[l][i]
            assert found==1
            prefix|=s_bin<<shift; pmask|=255<<shift; k_rem=s_krem
    Tk=prefix; need_eq=k_rem
    cta_eq=[0]*C; cta_gt=[0]*C; per=[]
    for r,(slo,shi) in enumerate(slices):
        sc=shi-slo
        seg=((sc+W*32-1)//(W*32))*32
        eqw=[0]*W; gtw=[0]*W
        for w in range(W):
            wbeg=min(shi,slo+w*seg); wend=min(shi,wbeg+seg)
            for j in range(wbeg,wend):
                gtw[w]+= take_all or keys[j]>Tk
                eqw[w]+= (not take_all) and keys[j]==Tk
        cta_eq[r]=sum(eqw); cta_gt[r]=sum(gtw); per.append((seg,eqw,gtw))
    for r,(slo,shi) in enumerate(slices):
        seg,eqw,gtw=per[r]
        eb=0; sb=0
        for q in range(r):
            sb+=cta_gt[q]+min(max(need_eq-eb,0),cta_eq[q]); eb+=cta_eq[q]
        be=[0]*W; bs=[0]*W
        for w in range(W):
            be[w]=eb; bs[w]=sb
            take=min(max(need_eq-eb,0),eqw[w]); sb+=gtw[w]+take; eb+=eqw[w]
        for w in range(W):
            wbeg=min(shi,slo+w*seg); wend=min(shi,wbeg+seg)
            eq_r=be[w]; sel_r=bs[w]
            j0=wbeg
            while j0<wend:
                gts=[];eqs=[]
                for lane in range(32):
                    j=j0+lane; gt=eq=False
                    if j<wend:
                        gt= take_all or keys[j]>Tk
                        eq= (not take_all) and keys[j]==Tk
                    gts.append(gt); eqs.append(eq)
                eqb=sum(1<<l for l in range(32) if eqs[l])
                sels=[gts[l] or (eqs[l] and eq_r+popc(eqb&((1<<l)-1))<need_eq) for l in range(32)]
                selb=sum(1<<l for l in range(32) if sels[l])
                for l in range(32):
                    if sels[l]:
                        pos=s0+sel_r+popc(selb&((1<<l)-1))
                        assert out[pos] is None, (pos, out[pos])
                        out[pos]=j0+l
                eq_r+=popc(eqb); sel_r+=popc(selb)
                j0+=32
    return out,count

def ref(keys,n,page,last,budget,sinks_p,wt,mph):
    # topk_one from page_bound.cpp
    length=(n-1)*page+last
    sinks=min(sinks_p,n); first=max(0,length-wt)
    window= first//page if wt>0 else n-1
    window=min(window,n-1)
    kept= n if sinks>=window else sinks+(n-window)
    total=min(n,max(budget,kept)); need=total-kept
    out=[j for j in range(min(sinks,window))]
    if need>0:
        cand=sorted(range(sinks,window), key=lambda j:(-keys[j], j))[:need]
        out+=sorted(cand)
    out+=list(range(window,n))
    cnt=len(out)
    return out+[-1]*(mph-cnt), cnt

RADIX=0
random.seed(1)
for trial in range(3000):
    n=random.choice([1,2,3,5,17,100,257,300,1000,1025,2049,5000,9000])
    page=random.choice([1,7,16])
    last=random.randint(1,page)
    budget=random.choice([0,1,3,10,64,500,100000,n//2,n-3,n//3])
    sinks=random.choice([0,1,4])
    wt=random.choice([0,1,30,200])
    mode=random.choice(['rand','few','same','bytes'])
    if mode=='rand': keys=[random.getrandbits(32) for _ in range(n)]
    elif mode=='few': keys=[random.choice([0x80000000,0xC0000000,0xC0000001,0x40]) for _ in range(n)]
    elif mode=='same': keys=[0xBF800000]*n
    else: keys=[0xC1230000|random.getrandbits(4)<<8|random.getrandbits(2) for _ in range(n)]
    mph=min(n,max(budget, min(n, sinks+((wt+page-1)//page+1 if wt>0 else 1))))
    C=random.choice([1,2,4,8,8])
    a=kernel(keys,n,page,last,budget,sinks,wt,mph)
    b=ref(keys,n,page,last,budget,sinks,wt,mph)
    assert a==b, (trial,n,page,last,budget,sinks,wt,mode,a[1],b[1])
print("ok", RADIX)
