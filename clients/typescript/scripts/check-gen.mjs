// Regenerates src/gen from the protos and fails if that changed anything (CI: the generated code is
// current). Runs the locked buf and protoc-gen-es from node_modules, so the output is reproducible.
import { execFileSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const bin = join(root, "node_modules", ".bin");
const env = { ...process.env, PATH: `${bin}:${process.env.PATH ?? ""}` };
execFileSync(join(bin, "buf"), ["generate"], { cwd: root, env, stdio: "inherit" });
const changed = execFileSync("git", ["status", "--porcelain", "--", "src/gen"], { cwd: root, encoding: "utf8" });
if (changed.trim()) {
  console.error(`src/gen is not current (run \`npm run gen\` and commit):\n${changed}`);
  execFileSync("git", ["--no-pager", "diff", "--stat", "--", "src/gen"], { cwd: root, stdio: "inherit" });
  process.exit(1);
}
console.log("src/gen is current");
