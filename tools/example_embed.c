/* Embedding g4 through its C API: open a plan, feed a prompt, stream a greedy reply.
 * Build: linked against g4_runtime (see tools/CMakeLists.txt). Usage: example_embed PLAN "prompt" */
#include <g4/g4.h>
#include <stdio.h>
#include <string.h>

static int32_t print_piece(void* user, int32_t token, const char* text, size_t len) {
    (void)user, (void)token;
    fwrite(text, 1, len, stdout);
    return 0; /* keep going */
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLAN PROMPT\n", argv[0]);
        return 2;
    }
    g4_engine* engine   = NULL;
    g4_session* session = NULL;
    int32_t ids[4096];
    size_t n_ids = 0;
    int rc       = 1;

    if (g4_engine_open(argv[1], NULL, &engine) != G4_OK) goto fail;
    if (g4_session_create(engine, NULL, &session) != G4_OK) goto fail;
    if (g4_tokenize(engine, argv[2], strlen(argv[2]), 1, ids, 4096, &n_ids) != G4_OK) goto fail;
    if (g4_session_append_tokens(session, ids, n_ids, NULL, 0) != G4_OK) goto fail;

    g4_sampling_params sampling = g4_sampling_params_default(); /* greedy */
    g4_generate_params gen      = g4_generate_params_default();
    gen.max_tokens              = 16;
    int32_t n_generated         = 0;
    if (g4_session_generate(session, &sampling, &gen, print_piece, NULL, &n_generated) != G4_OK) goto fail;
    printf("\n[%d tokens]\n", n_generated);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "example_embed: %s\n", g4_last_error_message());
done:
    g4_session_destroy(session);
    g4_engine_close(engine);
    return rc;
}
