// transformers.js (@lenml/tokenizers) encode throughput on the same document,
// for comparison with tokenizer_bench (single-threaded, like node itself).
//
//   npm install --prefix /tmp/tjs @lenml/tokenizers
//   NODE_PATH=/tmp/tjs/node_modules node benchmarks/tokenizer_bench_transformersjs.cjs \
//       TOKENIZER_JSON TEXT_FILE [REPEATS]
//
// With --ids instead of REPEATS it prints the ids (add_special_tokens false),
// the second oracle used in tests/oracle.
const fs = require("fs");
const { TokenizerLoader } = require("@lenml/tokenizers");

const [jsonPath, textPath, third] = process.argv.slice(2);
if (!jsonPath || !textPath) {
  console.error("usage: tokenizer_bench_transformersjs.cjs TOKENIZER_JSON TEXT_FILE [REPEATS|--ids]");
  process.exit(2);
}
const t0 = process.hrtime.bigint();
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(jsonPath, "utf8")),
  tokenizerConfig: {},
});
const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
const bytes = fs.readFileSync(textPath);
const text = bytes.toString("utf8");
if (third === "--ids") {
  console.log(tok.encode(text, { add_special_tokens: false }).join(" "));
  process.exit(0);
}
const repeats = Math.max(1, parseInt(third || "20", 10));
const mb = bytes.length / 1e6;
const time = () => {
  const s = process.hrtime.bigint();
  const n = tok.encode(text, { add_special_tokens: false }).length;
  return [Number(process.hrtime.bigint() - s) / 1e9, n];
};
const [firstS, nIds] = time();
const times = [];
for (let r = 0; r < repeats; r++) times.push(time()[0]);
times.sort((a, b) => a - b);
const median = times[Math.floor(times.length / 2)];
console.log(`tokenizer ${jsonPath}\ntext ${textPath}: ${bytes.length} bytes, ${nIds} ids`);
console.log(`load ${loadS.toFixed(3)} s`);
console.log(`first encode ${(mb / firstS).toFixed(2)} MB/s (${firstS.toFixed(4)} s)`);
console.log(`median of ${repeats} encodes ${(mb / median).toFixed(2)} MB/s (${median.toFixed(4)} s), best ${(mb / times[0]).toFixed(2)} MB/s`);
