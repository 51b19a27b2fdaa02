// Drives a live moe-worker with the official OpenAI Node client; prints one
// JSON line that tests/openai/http_process_test.cc checks.
//   BASE_URL=http://127.0.0.1:PORT/v1 MODEL=tiny node client_test.mjs
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'unused', maxRetries: 0 });
const model = process.env.MODEL;
const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: [{ type: 'text', text: 'Hello' }, { type: 'text', text: ' there' }] },
];

const out = { text: '', tokens: [], finish: null, usage: null, chunks: 0 };
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, logprobs: true, stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  out.chunks += 1;
  if (chunk.choices.length > 0) {
    const c = chunk.choices[0];
    out.text += c.delta.content ?? '';
    for (const t of c.logprobs?.content ?? []) out.tokens.push(t.bytes);
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  if (chunk.usage) out.usage = chunk.usage;
}
const whole = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
out.nonstream_text = whole.choices[0].message.content;
// The same conversation again: its prompt comes from the prefix cache.
out.cached_first = out.usage?.prompt_tokens_details?.cached_tokens;
out.cached_repeat = whole.usage?.prompt_tokens_details?.cached_tokens;
const completion = await client.completions.create({ model, prompt: 'Hello', max_tokens: 4, temperature: 0 });
out.completion_text = completion.choices[0].text;
try {
  await client.chat.completions.create({ model, messages, n: 2 });
} catch (e) {
  out.error = { status: e.status, message: e.error?.message ?? e.message, param: e.error?.param };
}
const models = await client.models.list();
out.models = models.data.map((m) => m.id);
console.log(JSON.stringify(out));
