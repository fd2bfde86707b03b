#ifndef CCURL_H
#define CCURL_H
// A one-to-one shim over libcurl: curl_easy_setopt, curl_easy_getinfo and curl_multi_setopt are
// variadic and cannot be called from Swift, so each argument kind gets one typed wrapper here.
// No logic lives in this file.
#include <curl/curl.h>

typedef size_t (*ccurl_write_callback)(char *ptr, size_t size, size_t nmemb, void *userdata);
typedef int (*ccurl_xferinfo_callback)(void *clientp, curl_off_t dltotal, curl_off_t dlnow,
                                       curl_off_t ultotal, curl_off_t ulnow);

CURLcode ccurl_easy_setopt_long(CURL *handle, CURLoption option, long value);
CURLcode ccurl_easy_setopt_off_t(CURL *handle, CURLoption option, curl_off_t value);
CURLcode ccurl_easy_setopt_pointer(CURL *handle, CURLoption option, void *value);
CURLcode ccurl_easy_setopt_string(CURL *handle, CURLoption option, const char *value);
CURLcode ccurl_easy_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value);
CURLcode ccurl_easy_setopt_write_callback(CURL *handle, CURLoption option, ccurl_write_callback value);
CURLcode ccurl_easy_setopt_xferinfo_callback(CURL *handle, CURLoption option, ccurl_xferinfo_callback value);

CURLcode ccurl_easy_getinfo_long(CURL *handle, CURLINFO info, long *value);
CURLcode ccurl_easy_getinfo_off_t(CURL *handle, CURLINFO info, curl_off_t *value);
CURLcode ccurl_easy_getinfo_string(CURL *handle, CURLINFO info, const char **value);
CURLcode ccurl_easy_getinfo_pointer(CURL *handle, CURLINFO info, void **value);

CURLMcode ccurl_multi_setopt_long(CURLM *handle, CURLMoption option, long value);

// curl_version_info(CURLVERSION_NOW)->version: CURLVERSION_NOW is a macro Swift does not import.
const char *ccurl_version_number(void);

// CURL_WRITEFUNC_PAUSE and CURL_READFUNC_ABORT are macros of casts Swift does not import.
size_t ccurl_writefunc_pause(void);
#endif
