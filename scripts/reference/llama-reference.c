/*
 * llama-reference: greedy generation with llama.cpp (CPU), printed as a saguaro golden file.
 *
 * Built and run by scripts/reference/make-references.sh; linked against a llama.cpp build
 * (libllama, libggml). It reads a spec file, one record per line:
 *
 *   prompt <text>              a text prompt, tokenized with the special tokens the vocabulary
 *                              adds (BOS where tokenizer.ggml.add_bos_token says so) and with
 *                              special-token parsing on ("<start_of_turn>" is one id)
 *   ids <label> <id> <id> ...  a prompt given as token ids; <label> is recorded as "prompt"
 *   tokenize <text>            a tokenizer case: no BOS/EOS added, special-token parsing on
 *
 * <text> and <label> take C-style escapes (\\ \n \t \r \" \xHH), so a record stays on one line.
 * Blank lines and lines starting with '#' are ignored.
 *
 * Every case runs in a fresh context: the prompt in one batch, then one token per decode. At
 * generated position j it records the five largest logits of the row that predicts token j (the
 * prompt's last row for j = 0, the row of generated token j - 1 after that) and takes the argmax
 * (the lowest id on an exact tie). With --stop-eog a case ends after a token llama.cpp counts as
 * end of generation (that token included); without it every case runs n tokens.
 *
 * Numerics: f32 K and V cache, flash attention off, weights in the file's own types, no
 * repacking of quantized weights into CPU-specific layouts, a fixed thread count.
 *
 * Output: JSON on stdout, in the format of the files in tests/golden/.
 */

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define TOP_K 5

static void die(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llama-reference: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void * xrealloc(void * p, size_t n) {
    void * q = realloc(p, n ? n : 1);
    if (!q) {
        die("out of memory");
    }
    return q;
}

/* ---- byte buffers ---- */

typedef struct {
    char * data;
    size_t len;
    size_t cap;
} buf_t;

static void buf_push(buf_t * b, const char * s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = xrealloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

/* ---- the spec file ---- */

enum rec_kind { REC_PROMPT, REC_IDS, REC_TOKENIZE };

typedef struct {
    enum rec_kind kind;
    buf_t text; /* prompt text, label, or tokenizer text */
    llama_token * ids;
    int n_ids;
} record_t;

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decode the escaped field starting at s, up to end (exclusive). */
static void unescape(const char * s, const char * end, buf_t * out, int lineno) {
    buf_push(out, "", 0);
    while (s < end) {
        char c = *s++;
        if (c != '\\') {
            buf_push(out, &c, 1);
            continue;
        }
        if (s >= end) die("spec line %d: a lone backslash at the end", lineno);
        char e = *s++;
        char v;
        switch (e) {
            case 'n': v = '\n'; break;
            case 't': v = '\t'; break;
            case 'r': v = '\r'; break;
            case '\\': v = '\\'; break;
            case '"': v = '"'; break;
            case 's': v = ' '; break;
            case 'x': {
                if (end - s < 2 || hexval(s[0]) < 0 || hexval(s[1]) < 0) die("spec line %d: bad \\x escape", lineno);
                v = (char) (hexval(s[0]) * 16 + hexval(s[1]));
                s += 2;
            } break;
            default: die("spec line %d: unknown escape \\%c", lineno, e);
        }
        buf_push(out, &v, 1);
    }
}

static record_t * read_spec(const char * path, int * n_out) {
    FILE * f = fopen(path, "rb");
    if (!f) die("cannot open spec %s", path);
    record_t * recs = NULL;
    int n = 0;
    buf_t line = {0};
    int lineno = 0;
    int c;
    bool eof = false;
    while (!eof) {
        line.len = 0;
        buf_push(&line, "", 0);
        while ((c = fgetc(f)) != EOF && c != '\n') {
            char ch = (char) c;
            buf_push(&line, &ch, 1);
        }
        eof = c == EOF;
        lineno++;
        if (line.len == 0 || line.data[0] == '#') continue;

        char * sp = strchr(line.data, ' ');
        const char * rest = sp ? sp + 1 : line.data + line.len;
        size_t kw_len = sp ? (size_t) (sp - line.data) : line.len;
        const char * end = line.data + line.len;

        recs = xrealloc(recs, sizeof(record_t) * (n + 1));
        record_t * r = &recs[n];
        memset(r, 0, sizeof *r);

        if (kw_len == 6 && !strncmp(line.data, "prompt", 6)) {
            r->kind = REC_PROMPT;
            unescape(rest, end, &r->text, lineno);
        } else if (kw_len == 8 && !strncmp(line.data, "tokenize", 8)) {
            r->kind = REC_TOKENIZE;
            unescape(rest, end, &r->text, lineno);
        } else if (kw_len == 3 && !strncmp(line.data, "ids", 3)) {
            r->kind = REC_IDS;
            const char * lab_end = strchr(rest, ' ');
            if (!lab_end) lab_end = end;
            unescape(rest, lab_end, &r->text, lineno);
            const char * p = lab_end;
            while (p < end) {
                while (p < end && *p == ' ') p++;
                if (p >= end) break;
                char * q;
                long v = strtol(p, &q, 10);
                if (q == p || v < 0) die("spec line %d: bad token id", lineno);
                r->ids = xrealloc(r->ids, sizeof(llama_token) * (r->n_ids + 1));
                r->ids[r->n_ids++] = (llama_token) v;
                p = q;
            }
            if (r->n_ids == 0) die("spec line %d: no ids", lineno);
        } else {
            die("spec line %d: unknown record (want prompt, ids or tokenize)", lineno);
        }
        n++;
    }
    fclose(f);
    free(line.data);
    *n_out = n;
    return recs;
}

/* ---- JSON output ---- */

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 if it is not one. */
static int utf8_len(const unsigned char * s, size_t n) {
    unsigned c = s[0];
    int len;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < (size_t) len) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
        return 0;
    }
    return len;
}

/* A JSON string; bytes that are not valid UTF-8 become U+FFFD. */
static void json_str(FILE * out, const char * s, size_t n) {
    const unsigned char * p = (const unsigned char *) s;
    fputc('"', out);
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c == '"') { fputs("\\\"", out); i++; continue; }
        if (c == '\\') { fputs("\\\\", out); i++; continue; }
        if (c == '\n') { fputs("\\n", out); i++; continue; }
        if (c == '\t') { fputs("\\t", out); i++; continue; }
        if (c == '\r') { fputs("\\r", out); i++; continue; }
        if (c < 0x20 || c == 0x7f) { fprintf(out, "\\u%04x", c); i++; continue; }
        int len = utf8_len(p + i, n - i);
        if (len == 0) {
            fputs("\xef\xbf\xbd", out);
            i++;
            continue;
        }
        fwrite(p + i, 1, len, out);
        i += len;
    }
    fputc('"', out);
}

static void json_ids(FILE * out, const llama_token * ids, int n) {
    fputc('[', out);
    for (int i = 0; i < n; i++) {
        fprintf(out, "%s%d", i ? ", " : "", ids[i]);
    }
    fputc(']', out);
}

/* ---- llama.cpp ---- */

static void quiet_log(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static llama_token * tokenize(const struct llama_vocab * vocab, const buf_t * text, bool add_special, int * n_out) {
    int cap = (int) text->len + 8;
    llama_token * ids = xrealloc(NULL, sizeof(llama_token) * cap);
    int n = llama_tokenize(vocab, text->data, (int32_t) text->len, ids, cap, add_special, true);
    if (n < 0) {
        cap = -n;
        ids = xrealloc(ids, sizeof(llama_token) * cap);
        n = llama_tokenize(vocab, text->data, (int32_t) text->len, ids, cap, add_special, true);
    }
    if (n < 0) die("tokenization failed");
    *n_out = n;
    return ids;
}

static void detokenize(const struct llama_vocab * vocab, const llama_token * ids, int n, buf_t * out) {
    int cap = 64 + 32 * n;
    char * s = xrealloc(NULL, cap);
    int len = llama_detokenize(vocab, ids, n, s, cap, false, true);
    if (len < 0) {
        cap = -len;
        s = xrealloc(s, cap);
        len = llama_detokenize(vocab, ids, n, s, cap, false, true);
    }
    if (len < 0) die("detokenization failed");
    out->len = 0;
    buf_push(out, s, len);
    free(s);
}

typedef struct {
    llama_token id;
    float logit;
} cand_t;

/* The k largest logits, largest first; equal logits in id order. */
static void top_k(const float * logits, int n_vocab, cand_t * top) {
    for (int k = 0; k < TOP_K; k++) {
        top[k].id = -1;
        top[k].logit = -INFINITY;
    }
    for (int i = 0; i < n_vocab; i++) {
        float v = logits[i];
        if (!isfinite(v)) die("logit %d is not finite", i);
        if (top[TOP_K - 1].id >= 0 && !(v > top[TOP_K - 1].logit)) continue;
        int k = TOP_K - 1;
        while (k > 0 && (top[k - 1].id < 0 || v > top[k - 1].logit)) {
            top[k] = top[k - 1];
            k--;
        }
        top[k].id = i;
        top[k].logit = v;
    }
}

static void usage(void) {
    fprintf(stderr,
            "usage: llama-reference MODEL.gguf SPEC [options]\n"
            "  -n N            tokens to generate per case (default 16)\n"
            "  -t N            threads (default 1)\n"
            "  -c N            context size (default 256; it also picks Phi-3's short/long rope factors)\n"
            "  --stop-eog      end a case after an end-of-generation token\n"
            "  --name NAME     the \"model\" field (default: MODEL's file name)\n"
            "  --reference S   text put first in the \"reference\" field (e.g. the llama.cpp version)\n");
    exit(2);
}

int main(int argc, char ** argv) {
    const char * model_path = NULL;
    const char * spec_path = NULL;
    const char * name = NULL;
    const char * ref_text = "llama.cpp";
    int n_gen = 16;
    int n_threads = 1;
    int n_ctx = 256;
    bool stop_eog = false;

    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        if (!strcmp(a, "-n") && i + 1 < argc) n_gen = atoi(argv[++i]);
        else if (!strcmp(a, "-t") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(a, "-c") && i + 1 < argc) n_ctx = atoi(argv[++i]);
        else if (!strcmp(a, "--stop-eog")) stop_eog = true;
        else if (!strcmp(a, "--name") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(a, "--reference") && i + 1 < argc) ref_text = argv[++i];
        else if (a[0] == '-') usage();
        else if (!model_path) model_path = a;
        else if (!spec_path) spec_path = a;
        else usage();
    }
    if (!model_path || !spec_path || n_gen < 1 || n_threads < 1 || n_ctx < 1) usage();
    if (!name) {
        const char * slash = strrchr(model_path, '/');
        name = slash ? slash + 1 : model_path;
    }

    int n_recs;
    record_t * recs = read_spec(spec_path, &n_recs);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_mmap = true;
    mp.use_extra_bufts = false; /* no CPU-specific repacking of quantized weights */
    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) die("cannot load %s", model_path);
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    /* Tokenize and check that every prompt fits the context. */
    int max_prompt = 0;
    for (int r = 0; r < n_recs; r++) {
        record_t * rec = &recs[r];
        if (rec->kind == REC_PROMPT) {
            rec->ids = tokenize(vocab, &rec->text, true, &rec->n_ids);
        } else if (rec->kind == REC_TOKENIZE) {
            rec->ids = tokenize(vocab, &rec->text, false, &rec->n_ids);
        } else {
            for (int i = 0; i < rec->n_ids; i++) {
                if (rec->ids[i] >= n_vocab) die("prompt id %d is outside the %d-token vocabulary", rec->ids[i], n_vocab);
            }
        }
        if (rec->kind != REC_TOKENIZE) {
            if (rec->n_ids == 0) die("an empty prompt");
            if (rec->n_ids > max_prompt) max_prompt = rec->n_ids;
        }
    }
    if (max_prompt + n_gen > n_ctx) die("prompt (%d) + %d tokens exceed the context (%d)", max_prompt, n_gen, n_ctx);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = max_prompt > 512 ? max_prompt : 512;
    cp.n_ubatch = cp.n_batch;
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn = false;
    cp.offload_kqv = false;
    cp.op_offload = false;
    cp.no_perf = true;

    FILE * out = stdout;
    fprintf(out, "{\n \"model\": ");
    json_str(out, name, strlen(name));
    {
        char ref[2048];
        snprintf(ref, sizeof ref,
                 "%s, CPU, scripts/reference/llama-reference.c: %d thread%s, n_ctx %d, n_batch = n_ubatch = %d, "
                 "f32 K/V cache, flash attention off, no weight repacking, greedy argmax (lowest id on ties)%s; "
                 "text prompts tokenized with the vocabulary's own special tokens (add_special) and parse_special, "
                 "tokenizer cases with add_special off and parse_special on",
                 ref_text, n_threads, n_threads == 1 ? "" : "s", n_ctx, cp.n_batch,
                 stop_eog ? ", a case stops after an end-of-generation token (included)" : ", no stop tokens");
        fprintf(out, ",\n \"reference\": ");
        json_str(out, ref, strlen(ref));
    }
    fprintf(out, ",\n \"n_tokens\": %d,\n \"tokenizer\": [", n_gen);
    bool first = true;
    for (int r = 0; r < n_recs; r++) {
        record_t * rec = &recs[r];
        if (rec->kind != REC_TOKENIZE) continue;
        fprintf(out, "%s\n  {\"text\": ", first ? "" : ",");
        json_str(out, rec->text.data, rec->text.len);
        fprintf(out, ", \"ids\": ");
        json_ids(out, rec->ids, rec->n_ids);
        fprintf(out, "}");
        first = false;
    }
    fprintf(out, "%s],\n \"cases\": [", first ? "" : "\n ");

    first = true;
    llama_token * gen = xrealloc(NULL, sizeof(llama_token) * n_gen);
    cand_t * tops = xrealloc(NULL, sizeof(cand_t) * TOP_K * n_gen);
    buf_t text = {0};
    for (int r = 0; r < n_recs; r++) {
        record_t * rec = &recs[r];
        if (rec->kind == REC_TOKENIZE) continue;

        struct llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) die("cannot create a context");

        int n_done = 0;
        llama_token * prompt = xrealloc(NULL, sizeof(llama_token) * rec->n_ids);
        memcpy(prompt, rec->ids, sizeof(llama_token) * rec->n_ids);
        struct llama_batch batch = llama_batch_get_one(prompt, rec->n_ids);
        for (int j = 0; j < n_gen; j++) {
            if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
            const float * logits = llama_get_logits_ith(ctx, -1);
            if (!logits) die("no logits");
            cand_t * top = &tops[TOP_K * j];
            top_k(logits, n_vocab, top);
            gen[j] = top[0].id;
            n_done = j + 1;
            if (llama_vocab_is_eog(vocab, gen[j])) {
                fprintf(stderr, "llama-reference: case %d: end-of-generation token %d at position %d%s\n", r, gen[j], j,
                        stop_eog ? ", stopping" : "");
                if (stop_eog) break;
            }
            batch = llama_batch_get_one(&gen[j], 1);
        }
        llama_free(ctx);
        free(prompt);

        fprintf(out, "%s\n  {\n   \"prompt\": ", first ? "" : ",");
        json_str(out, rec->text.data, rec->text.len);
        fprintf(out, ",\n   \"prompt_ids\": ");
        json_ids(out, rec->ids, rec->n_ids);
        fprintf(out, ",\n   \"greedy_ids\": ");
        json_ids(out, gen, n_done);
        detokenize(vocab, gen, n_done, &text);
        fprintf(out, ",\n   \"greedy_text\": ");
        json_str(out, text.data, text.len);
        fprintf(out, ",\n   \"top5\": [");
        for (int j = 0; j < n_done; j++) {
            fprintf(out, "%s\n    [", j ? "," : "");
            for (int k = 0; k < TOP_K; k++) {
                fprintf(out, "%s[%d, %.6f]", k ? ", " : "", tops[TOP_K * j + k].id, tops[TOP_K * j + k].logit);
            }
            fprintf(out, "]");
        }
        fprintf(out, "\n   ]\n  }");
        first = false;
    }
    fprintf(out, "%s]\n}\n", first ? "" : "\n ");

    llama_model_free(model);
    llama_backend_free();
    return 0;
}
