/* Decoding CPU of zstd frames by frame size, with a new context each frame (ZSTD_decompress) and with a kept one
   (ZSTD_decompressDCtx), for issue 48's frame-size trade-off (RESULTS.md, "Issue 48: installs against the physical
   floor"). Makes MiB of base64-like text (kind 0) or of half-random, half-table content like case 10's (kind 1), cuts it
   into frames of 32 KiB to 1 MiB, compresses each at level 3, and prints, as a markdown row per frame size, the
   compression ratio and the thread CPU seconds per GiB to decode all frames (best of 3).

   cc -O2 Benchmarks/analysis/zstd_frames.c -lzstd -o /tmp/zstd_frames && /tmp/zstd_frames 256 0 && /tmp/zstd_frames 256 1
   (libzstd-dev; not run by Benchmarks/run) */
#include <zstd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double cpu(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  size_t total=(size_t)atol(argv[1])<<20; int kind=atoi(argv[2]);
  unsigned char *src=malloc(total);
  const char*tab="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  unsigned long long x=88172645463325252ULL;
  for(size_t i=0;i<total;i++){ x^=x<<13;x^=x>>7;x^=x<<17;
    if(kind==0) src[i]=(i%77==76)?'\n':tab[(x>>20)&63];
    else src[i]= ((i>>19)&1) ? (unsigned char)(i&255) : (unsigned char)(x>>24); }
  size_t sizes[]={32<<10,64<<10,128<<10,256<<10,1<<20};
  ZSTD_DCtx*d=ZSTD_createDCtx(); ZSTD_CCtx*c=ZSTD_createCCtx(); ZSTD_CCtx_setParameter(c,ZSTD_c_compressionLevel,3);
  unsigned char*out=malloc(total); memset(out,1,total);
  for(int s=0;s<5;s++){
    size_t fs=sizes[s]; size_t n=(total+fs-1)/fs;
    unsigned char**fr=malloc(n*sizeof*fr); size_t*fl=malloc(n*sizeof*fl); size_t comp=0;
    for(size_t i=0;i<n;i++){ size_t len= (i==n-1)?total-i*fs:fs; size_t cap=ZSTD_compressBound(len); fr[i]=malloc(cap);
      fl[i]=ZSTD_compress2(c,fr[i],cap,src+i*fs,len); comp+=fl[i]; }
    double best1=1e9,best2=1e9;
    for(int r=0;r<3;r++){
    double t0=cpu();
    for(size_t i=0;i<n;i++){ size_t len=(i==n-1)?total-i*fs:fs; size_t r=ZSTD_decompress(out+i*fs,len,fr[i],fl[i]); if(ZSTD_isError(r)||r!=len){printf("err\n");return 1;} }
    double t1=cpu();
    for(size_t i=0;i<n;i++){ size_t len=(i==n-1)?total-i*fs:fs; size_t r=ZSTD_decompressDCtx(d,out+i*fs,len,fr[i],fl[i]); if(ZSTD_isError(r)){printf("err\n");return 1;} }
    double t2=cpu(); if(t1-t0<best1)best1=t1-t0; if(t2-t1<best2)best2=t2-t1; }
    printf("| %s | %zu KiB | %.3f | %.2f | %.2f |\n", kind?"mixed":"text", fs>>10, (double)comp/total, best1*(1<<30)/total,best2*(1<<30)/total);
    for(size_t i=0;i<n;i++) free(fr[i]);
    free(fr); free(fl);
  }
}
