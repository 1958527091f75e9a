//! A toy artifact that follows the forward-program contract on a real plugin: one layer, one
//! K/V head of width 1, K holding the token and V its position + 1. Each step scatters the new
//! K/V at `slotMapping`, gathers each row's pages by `blockTables`, masks by `seqLens`, and
//! returns `(Σ token·(position+1)) mod V` as the next token, with logits `-|v - next| · scale[v]`
//! (so the argmax is the next token and a badly uploaded `scale` weight shows).
//!
//! `reference_next` computes the same number from the plain token list: a wrong slot, page,
//! sequence length or a lost pool between steps changes the tokens.

use std::path::{Path, PathBuf};

use tlaloc_artifact::{
    ArtifactWriter, Dtype, Entry, FORMAT_VERSION, KvCacheLayout, Ladder, Manifest, ManifestModel,
    ManifestSourceFile, ManifestTokenizer, PaddingContract, ProgramSignature, Provenance,
    SourceCheckpoint,
};

pub const VOCAB: usize = 61;
pub const BLOCK_SIZE: usize = 4;

pub fn reference_next(tokens: &[u32]) -> u32 {
    let sum: u64 = tokens
        .iter()
        .enumerate()
        .map(|(p, t)| *t as u64 * (p as u64 + 1))
        .sum();
    (sum % VOCAB as u64) as u32
}

pub fn reference_generate(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    for _ in 0..max_tokens {
        tokens.push(reference_next(&tokens));
    }
    tokens[prompt.len()..].to_vec()
}

fn f32_hex(v: f32) -> String {
    format!("0x{:08X}", v.to_bits())
}

/// The StableHLO text of one entry.
pub fn body(b: usize, t: usize, c: usize, num_blocks: usize) -> String {
    let bs = BLOCK_SIZE;
    let cols = c / bs;
    let ns = num_blocks * bs;
    let v = VOCAB;
    let bt = b * t;
    let pool = format!("tensor<{num_blocks}x{bs}x1x1xf32>");
    let scatter = |name: &str, pool_in: &str, updates: &str| {
        format!(
            r#"    %{name} = "stablehlo.scatter"(%{pool_in}, %arg4, %{updates}) ({{
    ^bb0(%{name}_old: tensor<f32>, %{name}_new: tensor<f32>):
      "stablehlo.return"(%{name}_new) : (tensor<f32>) -> ()
    }}) {{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}} : (tensor<{ns}x1xf32>, tensor<{bt}xi32>, tensor<{bt}x1xf32>) -> tensor<{ns}x1xf32>
"#
        )
    };
    let gather = |name: &str, flat: &str| {
        format!(
            r#"    %{name}_pages = "stablehlo.reshape"(%{flat}) : (tensor<{ns}x1xf32>) -> tensor<{num_blocks}x{bs}xf32>
    %{name}_g = "stablehlo.gather"(%{name}_pages, %arg2) {{dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, {bs}>}} : (tensor<{num_blocks}x{bs}xf32>, tensor<{b}x{cols}xi32>) -> tensor<{b}x{cols}x{bs}xf32>
    %{name} = "stablehlo.reshape"(%{name}_g) : (tensor<{b}x{cols}x{bs}xf32>) -> tensor<{b}x{c}xf32>
"#
        )
    };
    // A decode entry donates tokenIds, positions, seqLens and slotMapping to the outputs that
    // carry them to the next step (nextTokenIds, nextPositions, nextSeqLens, nextSlotMapping).
    let carried = |output: usize| {
        if t == 1 {
            format!(" {{tf.aliasing_output = {output} : i32}}")
        } else {
            String::new()
        }
    };
    let (a0, a1, a3, a4) = (carried(2), carried(3), carried(4), carried(5));
    let mut s = String::new();
    s += &format!(
        "module @toy_b{b}_t{t}_c{c} {{\n  func.func public @main(%arg0: tensor<{b}x{t}xi32>{a0}, %arg1: tensor<{b}x{t}xi32>{a1}, %arg2: tensor<{b}x{cols}xi32>, %arg3: tensor<{b}xi32>{a3}, %arg4: tensor<{bt}xi32>{a4}, %arg5: tensor<{v}xf32>, %arg6: {pool} {{tf.aliasing_output = 6 : i32}}, %arg7: {pool} {{tf.aliasing_output = 7 : i32}}) -> (tensor<{b}x{v}xf32>, tensor<{b}xi32>, tensor<{b}x1xi32>, tensor<{b}x1xi32>, tensor<{b}xi32>, tensor<{b}xi32>, {pool}, {pool}) {{\n"
    );
    s += &format!(
        r#"    %tokf = "stablehlo.convert"(%arg0) : (tensor<{b}x{t}xi32>) -> tensor<{b}x{t}xf32>
    %ku = "stablehlo.reshape"(%tokf) : (tensor<{b}x{t}xf32>) -> tensor<{bt}x1xf32>
    %one = "stablehlo.constant"() {{value = dense<1> : tensor<{b}x{t}xi32>}} : () -> tensor<{b}x{t}xi32>
    %pos1 = "stablehlo.add"(%arg1, %one) : (tensor<{b}x{t}xi32>, tensor<{b}x{t}xi32>) -> tensor<{b}x{t}xi32>
    %posf = "stablehlo.convert"(%pos1) : (tensor<{b}x{t}xi32>) -> tensor<{b}x{t}xf32>
    %vu = "stablehlo.reshape"(%posf) : (tensor<{b}x{t}xf32>) -> tensor<{bt}x1xf32>
    %kflat = "stablehlo.reshape"(%arg6) : ({pool}) -> tensor<{ns}x1xf32>
    %vflat = "stablehlo.reshape"(%arg7) : ({pool}) -> tensor<{ns}x1xf32>
"#
    );
    s += &scatter("k2", "kflat", "ku");
    s += &scatter("v2", "vflat", "vu");
    s += &format!(
        r#"    %knew = "stablehlo.reshape"(%k2) : (tensor<{ns}x1xf32>) -> {pool}
    %vnew = "stablehlo.reshape"(%v2) : (tensor<{ns}x1xf32>) -> {pool}
"#
    );
    s += &gather("kc", "k2");
    s += &gather("vc", "v2");
    s += &format!(
        r#"    %p = "stablehlo.iota"() {{iota_dimension = 1 : i64}} : () -> tensor<{b}x{c}xi32>
    %lenb = "stablehlo.broadcast_in_dim"(%arg3) {{broadcast_dimensions = array<i64: 0>}} : (tensor<{b}xi32>) -> tensor<{b}x{c}xi32>
    %valid = "stablehlo.compare"(%p, %lenb) {{compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>}} : (tensor<{b}x{c}xi32>, tensor<{b}x{c}xi32>) -> tensor<{b}x{c}xi1>
    %prod = "stablehlo.multiply"(%kc, %vc) : (tensor<{b}x{c}xf32>, tensor<{b}x{c}xf32>) -> tensor<{b}x{c}xf32>
    %zeros = "stablehlo.constant"() {{value = dense<{zero}> : tensor<{b}x{c}xf32>}} : () -> tensor<{b}x{c}xf32>
    %masked = "stablehlo.select"(%valid, %prod, %zeros) : (tensor<{b}x{c}xi1>, tensor<{b}x{c}xf32>, tensor<{b}x{c}xf32>) -> tensor<{b}x{c}xf32>
    %zero = "stablehlo.constant"() {{value = dense<{zero}> : tensor<f32>}} : () -> tensor<f32>
    %sum = "stablehlo.reduce"(%masked, %zero) ({{
    ^bb0(%ra: tensor<f32>, %rb: tensor<f32>):
      %rs = "stablehlo.add"(%ra, %rb) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%rs) : (tensor<f32>) -> ()
    }}) {{dimensions = array<i64: 1>}} : (tensor<{b}x{c}xf32>, tensor<f32>) -> tensor<{b}xf32>
    %vocab = "stablehlo.constant"() {{value = dense<{vocab}> : tensor<{b}xf32>}} : () -> tensor<{b}xf32>
    %r = "stablehlo.remainder"(%sum, %vocab) : (tensor<{b}xf32>, tensor<{b}xf32>) -> tensor<{b}xf32>
    %next = "stablehlo.convert"(%r) : (tensor<{b}xf32>) -> tensor<{b}xi32>
    %nextids = "stablehlo.reshape"(%next) : (tensor<{b}xi32>) -> tensor<{b}x1xi32>
    %iv = "stablehlo.iota"() {{iota_dimension = 1 : i64}} : () -> tensor<{b}x{v}xf32>
    %rb2 = "stablehlo.broadcast_in_dim"(%r) {{broadcast_dimensions = array<i64: 0>}} : (tensor<{b}xf32>) -> tensor<{b}x{v}xf32>
    %d = "stablehlo.subtract"(%iv, %rb2) : (tensor<{b}x{v}xf32>, tensor<{b}x{v}xf32>) -> tensor<{b}x{v}xf32>
    %ad = "stablehlo.abs"(%d) : (tensor<{b}x{v}xf32>) -> tensor<{b}x{v}xf32>
    %sb = "stablehlo.broadcast_in_dim"(%arg5) {{broadcast_dimensions = array<i64: 1>}} : (tensor<{v}xf32>) -> tensor<{b}x{v}xf32>
    %m = "stablehlo.multiply"(%ad, %sb) : (tensor<{b}x{v}xf32>, tensor<{b}x{v}xf32>) -> tensor<{b}x{v}xf32>
    %logits = "stablehlo.negate"(%m) : (tensor<{b}x{v}xf32>) -> tensor<{b}x{v}xf32>
"#,
        zero = f32_hex(0.0),
        vocab = f32_hex(VOCAB as f32),
    );
    s += &next_step_inputs(b, t, c);
    s += &format!(
        r#"    "func.return"(%logits, %next, %nextids, %ns_pos, %ns_len, %ns_slot, %knew, %vnew) : (tensor<{b}x{v}xf32>, tensor<{b}xi32>, tensor<{b}x1xi32>, tensor<{b}x1xi32>, tensor<{b}xi32>, tensor<{b}xi32>, {pool}, {pool}) -> ()
  }}
}}
"#
    );
    s
}

/// The contract's next decode step inputs (`tlaloc_artifact::next_decode_row`) from the step
/// inputs `%arg2` (block tables), `%arg3` (lengths) and `%arg4` (slots): `%ns_pos`, `%ns_len`
/// and `%ns_slot`.
fn next_step_inputs(b: usize, t: usize, c: usize) -> String {
    let bs = BLOCK_SIZE;
    let cols = c / bs;
    let bt = b * t;
    let v = format!("tensor<{b}xi32>");
    let m = format!("tensor<{b}x{cols}xi32>");
    let signed = "compare_type = #stablehlo<comparison_type SIGNED>";
    format!(
        r#"    %ns_sm = "stablehlo.reshape"(%arg4) : (tensor<{bt}xi32>) -> tensor<{b}x{t}xi32>
    %ns_fs2 = "stablehlo.slice"(%ns_sm) {{start_indices = array<i64: 0, 0>, limit_indices = array<i64: {b}, 1>, strides = array<i64: 1, 1>}} : (tensor<{b}x{t}xi32>) -> tensor<{b}x1xi32>
    %ns_fs = "stablehlo.reshape"(%ns_fs2) : (tensor<{b}x1xi32>) -> {v}
    %ns_zero = "stablehlo.constant"() {{value = dense<0> : {v}}} : () -> {v}
    %ns_live = "stablehlo.compare"(%ns_fs, %ns_zero) {{{signed}, comparison_direction = #stablehlo<comparison_direction GE>}} : ({v}, {v}) -> tensor<{b}xi1>
    %ns_bs = "stablehlo.constant"() {{value = dense<{bs}> : {v}}} : () -> {v}
    %ns_col = "stablehlo.divide"(%arg3, %ns_bs) : ({v}, {v}) -> {v}
    %ns_cs = "stablehlo.multiply"(%ns_col, %ns_bs) : ({v}, {v}) -> {v}
    %ns_off = "stablehlo.subtract"(%arg3, %ns_cs) : ({v}, {v}) -> {v}
    %ns_colb = "stablehlo.broadcast_in_dim"(%ns_col) {{broadcast_dimensions = array<i64: 0>}} : ({v}) -> {m}
    %ns_ci = "stablehlo.iota"() {{iota_dimension = 1 : i64}} : () -> {m}
    %ns_in = "stablehlo.compare"(%ns_ci, %ns_colb) {{{signed}, comparison_direction = #stablehlo<comparison_direction EQ>}} : ({m}, {m}) -> tensor<{b}x{cols}xi1>
    %ns_zm = "stablehlo.constant"() {{value = dense<0> : {m}}} : () -> {m}
    %ns_pg = "stablehlo.select"(%ns_in, %arg2, %ns_zm) : (tensor<{b}x{cols}xi1>, {m}, {m}) -> {m}
    %ns_z0 = "stablehlo.constant"() {{value = dense<0> : tensor<i32>}} : () -> tensor<i32>
    %ns_page = "stablehlo.reduce"(%ns_pg, %ns_z0) ({{
    ^bb0(%ns_ra: tensor<i32>, %ns_rb: tensor<i32>):
      %ns_rs = "stablehlo.add"(%ns_ra, %ns_rb) : (tensor<i32>, tensor<i32>) -> tensor<i32>
      "stablehlo.return"(%ns_rs) : (tensor<i32>) -> ()
    }}) {{dimensions = array<i64: 1>}} : ({m}, tensor<i32>) -> {v}
    %ns_ps = "stablehlo.multiply"(%ns_page, %ns_bs) : ({v}, {v}) -> {v}
    %ns_s = "stablehlo.add"(%ns_ps, %ns_off) : ({v}, {v}) -> {v}
    %ns_end = "stablehlo.constant"() {{value = dense<{c}> : {v}}} : () -> {v}
    %ns_inside = "stablehlo.compare"(%arg3, %ns_end) {{{signed}, comparison_direction = #stablehlo<comparison_direction LT>}} : ({v}, {v}) -> tensor<{b}xi1>
    %ns_wr = "stablehlo.and"(%ns_live, %ns_inside) : (tensor<{b}xi1>, tensor<{b}xi1>) -> tensor<{b}xi1>
    %ns_m1 = "stablehlo.constant"() {{value = dense<-1> : {v}}} : () -> {v}
    %ns_slot = "stablehlo.select"(%ns_wr, %ns_s, %ns_m1) : (tensor<{b}xi1>, {v}, {v}) -> {v}
    %ns_p1 = "stablehlo.select"(%ns_live, %arg3, %ns_zero) : (tensor<{b}xi1>, {v}, {v}) -> {v}
    %ns_pos = "stablehlo.reshape"(%ns_p1) : ({v}) -> tensor<{b}x1xi32>
    %ns_one = "stablehlo.constant"() {{value = dense<1> : {v}}} : () -> {v}
    %ns_l1 = "stablehlo.add"(%arg3, %ns_one) : ({v}, {v}) -> {v}
    %ns_len = "stablehlo.select"(%ns_live, %ns_l1, %ns_one) : (tensor<{b}xi1>, {v}, {v}) -> {v}
"#
    )
}

fn model_config() -> ManifestModel {
    ManifestModel {
        architecture: "LlamaForCausalLM".into(),
        hidden_size: 1,
        intermediate_size: 1,
        num_layers: 1,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 1,
        vocab_size: VOCAB,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        tied_embeddings: true,
        attention_bias: false,
        max_position_embeddings: 32,
        bos_token_id: None,
        eos_token_ids: vec![],
    }
}

/// Writes the toy artifact with a pool of `num_blocks` pages into a new temporary folder: the
/// folder (removed when it drops) and the artifact's path in it.
pub fn temp(num_blocks: usize) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("toy");
    write(&dir, num_blocks);
    (tmp, dir)
}

/// Writes the toy artifact with a pool of `num_blocks` pages into `dir`.
pub fn write(dir: &Path, num_blocks: usize) {
    write_with(dir, num_blocks, &[1]);
}

/// [`temp`] with prefill entries of each of `prefill_batches` prompts.
pub fn temp_with(num_blocks: usize, prefill_batches: &[usize]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("toy");
    write_with(&dir, num_blocks, prefill_batches);
    (tmp, dir)
}

/// [`write`] with prefill entries of each of `prefill_batches` prompts.
pub fn write_with(dir: &Path, num_blocks: usize, prefill_batches: &[usize]) {
    let mut writer = ArtifactWriter::create(dir).expect("create the toy artifact");
    let scale: Vec<u8> = (0..VOCAB).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    let weight = writer
        .write_weight(0, "scale", Dtype::F32, &[VOCAB], &scale)
        .expect("write weight");
    let ladder = Ladder {
        max_batch: 4,
        max_context: 32,
        block_size: BLOCK_SIZE,
        batch_buckets: vec![1, 2, 4],
        context_buckets: vec![16, 32],
        prefill_chunks: vec![4, 8],
        prefill_batch_buckets: prefill_batches.to_vec(),
    };
    let mut manifest = Manifest {
        format_version: FORMAT_VERSION,
        model: model_config(),
        dtype: Dtype::F32,
        kv_cache: KvCacheLayout::for_model(&model_config(), Dtype::F32, BLOCK_SIZE, num_blocks),
        tensor_parallel: None,
        ladder: ladder.clone(),
        entries: Vec::new(),
        padding: PaddingContract::CONTRACT,
        weights: vec![weight],
        tokenizer: ManifestTokenizer {
            files: vec![],
            chat_template: None,
        },
        provenance: Provenance {
            source: SourceCheckpoint {
                kind: "toy".into(),
                files: vec![ManifestSourceFile {
                    name: "none".into(),
                    sha256: "0".repeat(64),
                }],
            },
            exporter: "runtime tests".into(),
            options: serde_json::json!({}),
        },
        executables: Vec::new(),
    };
    for point in ladder.points() {
        let text = body(point.batch, point.tokens, point.context, num_blocks);
        let path = writer.write_body(&text).expect("write body");
        manifest.entries.push(Entry::new(point, path));
    }
    for entry in &manifest.entries {
        writer
            .write_program(&ProgramSignature::expected_for(&manifest, entry))
            .expect("write program");
    }
    writer.finish(&manifest).expect("finish the toy artifact");
}
