// A fast OpenAI-compatible streaming server for measuring load generators, not models: every request gets
// max_tokens one-token SSE events at once (no model, no delay), then the usage chunk and [DONE].
//
//   node benchmarks/fake_server/fast_openai.js PORT
//
// Counts requests and events sent; GET /stats returns them, POST /stats/reset zeroes them.
"use strict";
const http = require("http");

const port = Number(process.argv[2] || 8000);
let requests = 0;
let events = 0;

function stream(res, body, chat) {
  const n = Math.max(1, Number(body.max_tokens) || 16);
  const model = body.model || "m";
  res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
  const head = `{"id":"x","object":"text_completion","model":"${model}","choices":[{"index":0,`;
  for (let i = 0; i < n; i++) {
    const choice = chat
      ? `"delta":{"content":"t"},"token_ids":[${i % 1000}]`
      : `"text":"t","token_ids":[${i % 1000}]`;
    res.write(`data: ${head}${choice},"finish_reason":${i === n - 1 ? '"length"' : "null"}}]}\n\n`);
  }
  res.write(`data: {"id":"x","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":${n},"total_tokens":${n + 8}}}\n\n`);
  res.end("data: [DONE]\n\n");
  requests += 1;
  events += n + 1;
}

const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/stats") {
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ requests, events }));
    return;
  }
  if (req.method === "POST" && req.url === "/stats/reset") {
    requests = 0;
    events = 0;
    res.writeHead(204);
    res.end();
    return;
  }
  if (req.method === "GET" && req.url === "/v1/models") {
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end('{"object":"list","data":[{"id":"m","object":"model"}]}');
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    let body = {};
    try {
      body = JSON.parse(Buffer.concat(chunks).toString() || "{}");
    } catch (e) {
      res.writeHead(400);
      res.end();
      return;
    }
    if (req.url === "/v1/completions" || req.url === "/v1/chat/completions") {
      stream(res, body, req.url === "/v1/chat/completions");
    } else {
      res.writeHead(404);
      res.end();
    }
  });
});
server.keepAliveTimeout = 60000;
server.listen(port, "127.0.0.1", () => console.log(`listening on ${port}`));
