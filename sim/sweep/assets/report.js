// report.html's script: sortable tables, the throughput-vs-memory scatter (sim/sweep/report_html.py)
const D = JSON.parse(document.getElementById('data').textContent);
function sortable(t){const hs=t.querySelectorAll('th');hs.forEach((h,i)=>h.addEventListener('click',()=>{
 const rows=[...t.tBodies[0].rows];const asc=h.dataset.asc!=='1';hs.forEach(x=>delete x.dataset.asc);
 h.dataset.asc=asc?'1':'0';const key=r=>{const c=r.cells[i];const v=c.dataset.v;return v!==undefined?+v:c.textContent};
 rows.sort((a,b)=>{const x=key(a),y=key(b);return (x<y?-1:x>y?1:0)*(asc?1:-1)});rows.forEach(r=>t.tBodies[0].appendChild(r));}));}
document.querySelectorAll('table.sort').forEach(sortable);
function scatter(){
 const W=900,H=420,L=70,B=45,svg=document.getElementById('pareto');const pts=D.points;if(!pts.length)return;
 const xs=pts.map(p=>p.mem),ys=pts.map(p=>p.tok);const x0=0,x1=Math.max(...xs,D.capacity||0)*1.05;
 const y0=Math.min(...ys)*0.9,y1=Math.max(...ys)*1.05;const sx=v=>L+(v-x0)/(x1-x0||1)*(W-L-20),sy=v=>H-B-(v-y0)/(y1-y0||1)*(H-B-20);
 const ns='http://www.w3.org/2000/svg';const el=(n,a)=>{const e=document.createElementNS(ns,n);for(const k in a)e.setAttribute(k,a[k]);svg.appendChild(e);return e};
 el('line',{x1:L,y1:H-B,x2:W-20,y2:H-B,stroke:'#444'});el('line',{x1:L,y1:20,x2:L,y2:H-B,stroke:'#444'});
 for(let i=0;i<=5;i++){const xv=x0+(x1-x0)*i/5,yv=y0+(y1-y0)*i/5;
  el('text',{x:sx(xv),y:H-B+16,'text-anchor':'middle','font-size':11}).textContent=xv.toFixed(0);
  el('text',{x:L-6,y:sy(yv)+4,'text-anchor':'end','font-size':11}).textContent=Math.round(yv).toLocaleString();}
 el('text',{x:(W+L)/2,y:H-6,'text-anchor':'middle','font-size':12}).textContent='peak memory per GPU (GiB)';
 const yl=el('text',{x:14,y:H/2,'text-anchor':'middle','font-size':12,transform:`rotate(-90 14 ${H/2})`});yl.textContent='tokens/s';
 if(D.capacity){el('line',{x1:sx(D.capacity),y1:20,x2:sx(D.capacity),y2:H-B,stroke:'#c00','stroke-dasharray':'4 3'});}
 const tip=document.getElementById('tip');
 pts.forEach(p=>{const c=el('circle',{cx:sx(p.mem),cy:sy(p.tok),r:p.front?4.5:2.5,fill:p.front?'#d62728':'#1f77b4',
  'fill-opacity':p.front?0.95:0.45,class:'pt'+(p.rank===1?' best':'')});c.dataset.id=p.id;
  c.addEventListener('mousemove',e=>{tip.style.display='block';tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';
   tip.innerHTML=`<b>#${p.rank}</b> ${p.plan}<br>${p.t.toFixed(3)} s/iteration, ${Math.round(p.tok).toLocaleString()} tokens/s, ${p.mem.toFixed(1)} GiB`;});
  c.addEventListener('mouseleave',()=>{tip.style.display='none'});
  c.addEventListener('click',()=>{const d=document.getElementById('plan-'+p.id);
   if(d){d.scrollIntoView({behavior:'smooth'});d.style.outline='3px solid #d62728';setTimeout(()=>d.style.outline='',1500);}
   else{alert(`#${p.rank} ${p.plan}: no timeline (only the ${D.written} written plans have one; see simpar sweep --plans)`);}});});
}
scatter();
document.body.dataset.rendered='yes';
