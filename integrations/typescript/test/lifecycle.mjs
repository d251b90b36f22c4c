// The adapter's own guarantees, apart from a conversation (run by
// tests/integrations/run.sh):
//
//   node lifecycle.mjs BIN VAULT SECRET_FLAG SECRET
//
// 1. a script that never closes its MemvaultMemory still exits (the
//    server and its pipes do not keep Node running), and its server stops;
// 2. HTTP mode: a 400 (a request the server could not read) is a ToolError
//    with the server's words, as process mode answers malformed input.
//
// Exits 1 with the reason on failure.
import { spawnSync } from 'node:child_process';
import { createServer } from 'node:http';
import { fileURLToPath } from 'node:url';
import { ToolError } from '@anthropic-ai/sdk/lib/tools/ToolError';
import { MemvaultMemory, MemvaultServerError } from '../memvault-memory.mjs';

const fail = (why) => {
  console.error(`lifecycle: FAIL: ${why}`);
  process.exit(1);
};

const [bin, vault, flag, secret] = process.argv.slice(2);

if (process.env.MEMVAULT_LIFECYCLE_CHILD) {
  // The child: one call, no close(); prints the server's pid.
  const memory = new MemvaultMemory({
    vault,
    binary: bin,
    ...(flag === '--key-file' ? { keyFile: secret } : { passphraseFile: secret }),
  });
  await memory.execute({ command: 'view', path: '/memories' });
  console.log(memory.pid);
} else {
  const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), bin, vault, flag, secret], {
    env: { ...process.env, MEMVAULT_LIFECYCLE_CHILD: '1' },
    timeout: 30_000,
    encoding: 'utf8',
  });
  if (child.error || child.status !== 0) {
    fail(`a script that never closed its MemvaultMemory did not exit by itself (${child.error?.message ?? `status ${child.status}`}): ${child.stderr}`);
  }
  const pid = Number(child.stdout.trim());
  let gone = false;
  for (let i = 0; i < 100 && !gone; i++) {
    try {
      process.kill(pid, 0);
      await new Promise((r) => setTimeout(r, 100));
    } catch {
      gone = true;
    }
  }
  if (!gone) fail(`the server of a MemvaultMemory never closed (pid ${pid}) still runs after its script exited`);
  console.log('lifecycle: a script that never closed its MemvaultMemory exits, and its server stops');

  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(400, { 'content-type': 'application/json', connection: 'close' });
      res.end(JSON.stringify({ error: 'the request body is not valid JSON (lone surrogate); send one JSON object' }));
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const memory = new MemvaultMemory({
    url: `http://127.0.0.1:${server.address().port}`,
    token: 'mvt_lifecycle_check_token_0123456789',
  });
  try {
    await memory.execute({ command: 'create', path: '/memories/a.md', file_text: 'a\ud800b' });
    fail('a 400 was taken as success');
  } catch (e) {
    if (e instanceof MemvaultServerError) fail(`a 400 was a MemvaultServerError, not a ToolError: ${e.message}`);
    if (!(e instanceof ToolError) || !String(e.content).includes('not valid JSON')) {
      fail(`a 400 gave ${e?.name}: ${e?.message ?? e?.content}`);
    }
  }
  server.close();
  console.log("lifecycle: a 400 is a ToolError with the server's words");
}
